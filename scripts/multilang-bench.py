#!/usr/bin/env python3
"""Bench of shardlease-multilang with the real amazon-kclpy, on kinesalite, printing JSON figures:

- daemon_rss_mb_at_16_leases: the daemon's resident memory (VmRSS, the daemon alone, not its
  children) once it runs a child for each of 16 shards;
- seconds_to_first_record: from starting the daemon to the first record processed by a child;
- daemon_records_per_sec / child_alone_records_per_sec / ratio: one shard with a backlog, read
  through the daemon, against the same application fed the same batches by a driver speaking the
  protocol directly (no daemon, no stream), so the ratio says whether the daemon is the bottleneck.

Usage (scripts/multilang-bench.sh sets this up):
  multilang-bench.py BINARY   with SHARDLEASE_TEST_KINESIS_ENDPOINT, PYTHONPATH (kclpy, boto3)
"""
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import boto3

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "multilang-bench", "app.py")
ENDPOINT = os.environ["SHARDLEASE_TEST_KINESIS_ENDPOINT"]
BINARY = sys.argv[1]
BACKLOG = int(os.environ.get("MLBENCH_RECORDS", "20000"))
BATCH = 10000

kinesis = boto3.client("kinesis", endpoint_url=ENDPOINT, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")


def wait(what, cond, timeout=120.0):
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() > deadline:
            sys.exit("multilang-bench: timed out waiting for %s" % what)
        time.sleep(0.01)


def stream(shards):
    name = "mlbench-%s" % uuid.uuid4().hex[:8]
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait("the stream", lambda: kinesis.describe_stream_summary(StreamName=name)
         ["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE")
    return name


def put(name, n, payload=b"x" * 100):
    shards = kinesis.list_shards(StreamName=name)["Shards"]
    for i in range(0, n, 500):
        entries = []
        for j in range(i, min(n, i + 500)):
            shard = shards[j % len(shards)]
            entries.append({"Data": payload, "PartitionKey": "k%d" % j,
                            "ExplicitHashKey": shard["HashKeyRange"]["StartingHashKey"]})
        kinesis.put_records(StreamName=name, Records=entries)


def daemon(name, work, extra=""):
    props = os.path.join(work, "app.properties")
    with open(props, "w") as f:
        f.write("executableName = %s %s\nstreamName = %s\napplicationName = %s\n"
                "regionName = us-east-1\nkinesisEndpoint = %s\nretrievalMode = POLLING\n"
                "initialPositionInStream = TRIM_HORIZON\nidleTimeBetweenReadsInMillis = 50\n"
                "maxRecords = %d\nshardlease.store = sqlite://%s/leases.db?mode=rwc\n%s"
                % (sys.executable, APP, name, name, ENDPOINT, BATCH, work, extra))
    out = os.path.join(work, "out")
    os.makedirs(out, exist_ok=True)
    # kinesalite takes any credentials; the AWS SDK's chain needs some.
    env = dict(os.environ, MLBENCH_OUT=out, RUST_LOG=os.environ.get("MLBENCH_LOG", "warn"), AWS_ACCESS_KEY_ID="test",
               AWS_SECRET_ACCESS_KEY="test", AWS_EC2_METADATA_DISABLED="true")
    log = open(os.path.join(work, "daemon.log"), "w")
    start = time.time()
    p = subprocess.Popen([BINARY, "--properties", props], env=env, stderr=log, stdout=log)
    return p, out, start


def counts(out):
    c = {}
    for shard in os.listdir(out):
        try:
            with open(os.path.join(out, shard)) as f:
                n, t = f.read().split()
            c[shard] = (int(n), float(t))
        except (ValueError, OSError):
            pass
    return c


def children(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return None


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)


def sixteen_leases():
    name = stream(16)
    put(name, 16)
    with tempfile.TemporaryDirectory() as work:
        p, out, start = daemon(name, work)
        wait("the first record", lambda: counts(out))
        first = min(t for _, t in counts(out).values()) - start
        wait("16 children", lambda: len(children(p.pid)) >= 16)
        wait("16 shards processed", lambda: len(counts(out)) >= 16)
        rss = 0.0
        for _ in range(20):
            rss = max(rss, rss_mb(p.pid) or 0.0)
            time.sleep(0.05)
        stop(p)
    return first, rss


def child_alone():
    """The same app, fed the same batches through its stdin by this driver."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, MLBENCH_OUT=out)
        p = subprocess.Popen([sys.executable, APP], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, bufsize=1, universal_newlines=True)

        def send(msg):
            p.stdin.write(json.dumps(msg) + "\n")
            p.stdin.flush()

        def until_status(action):
            while True:
                line = p.stdout.readline()
                if not line.strip():
                    continue
                m = json.loads(line)
                if m["action"] == "checkpoint":
                    send({"action": "checkpoint", "sequenceNumber": m.get("sequenceNumber"),
                          "subSequenceNumber": None, "error": None})
                elif m["action"] == "status" and m["responseFor"] == action:
                    return

        send({"action": "initialize", "shardId": "shardId-000000000000",
              "sequenceNumber": "TRIM_HORIZON", "subSequenceNumber": None})
        until_status("initialize")
        data = base64.b64encode(b"x" * 100).decode()
        seq = 49590338271490256608559692538361571095921575989136588898
        start = time.time()
        sent = 0
        while sent < BACKLOG:
            n = min(BATCH, BACKLOG - sent)
            records = [{"action": "record", "data": data, "partitionKey": "k%d" % (sent + i),
                        "sequenceNumber": str(seq + sent + i), "subSequenceNumber": None,
                        "approximateArrivalTimestamp": int(time.time() * 1000)}
                       for i in range(n)]
            send({"action": "processRecords", "millisBehindLatest": 0, "records": records})
            until_status("processRecords")
            sent += n
        elapsed = time.time() - start
        send({"action": "leaseLost"})
        until_status("leaseLost")
        p.stdin.close()
        p.wait(timeout=30)
    return BACKLOG / elapsed


def main():
    first, rss = sixteen_leases()
    # The daemon's rate: from its first batch written to its last, over the records between.
    name = stream(1)
    put(name, BACKLOG)
    with tempfile.TemporaryDirectory() as work:
        p, out, _ = daemon(name, work)
        n0, t0 = wait("the first batch", lambda: list(counts(out).values()))[0]
        n1, t1 = wait("the backlog", lambda: [v for v in counts(out).values() if v[0] >= BACKLOG])[0]
        stop(p)
    daemon_rate = (n1 - n0) / (t1 - t0) if t1 > t0 else None
    alone = child_alone()
    print(json.dumps({
        "scenario": "multilang",
        "client": "amazon-kclpy",
        "daemon_rss_mb_at_16_leases": round(rss, 1),
        "seconds_to_first_record": round(first, 3),
        "backlog_records": BACKLOG,
        "batch": BATCH,
        "daemon_records_per_sec": round(daemon_rate, 1) if daemon_rate else None,
        "child_alone_records_per_sec": round(alone, 1),
        "daemon_over_child_alone": round(daemon_rate / alone, 3) if daemon_rate else None,
    }))


if __name__ == "__main__":
    main()
