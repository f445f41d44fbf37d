// Starts kinesalite (an in-memory Kinesis emulator) on 127.0.0.1 only: its own command line binds
// every interface. Used by scripts/services.sh; the module is installed under target/services.
//
//   node scripts/kinesalite.js MODULE_DIR PORT
//
// Stream creation, deletion and resharding take no time (the tests await each step), and the
// shard limit is raised so tests can create many streams of many shards.
'use strict'
const path = require('path')
const [moduleDir, port] = process.argv.slice(2)
const kinesalite = require(path.join(moduleDir, 'node_modules', 'kinesalite'))
const server = kinesalite({
  createStreamMs: 0,
  deleteStreamMs: 0,
  updateStreamMs: 0,
  shardLimit: 100000,
})
server.listen(Number(port || 4567), '127.0.0.1', (err) => {
  if (err) {
    console.error(err)
    process.exit(1)
  }
  console.log('kinesalite listening on 127.0.0.1:' + server.address().port)
})
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0))
