#!/usr/bin/env node
/*
 * A small aws-kcl application (the KCL's Node.js client, its documented v2 record processor API,
 * unchanged KCL client code) for the daemon's end-to-end test. It appends to $AWS_KCL_TEST_OUT:
 *
 *   start SHARD SEQ          initialize (SEQ: the checkpoint or TRIM_HORIZON / LATEST / ...)
 *   pid SHARD PID            initialize
 *   record SHARD SEQ SUB DATA  every record
 *   checkpointed SHARD SEQ   a checkpoint the daemon confirmed (SEQ: a record's, or SHARD_END)
 *   shutdownRequested SHARD / leaseLost SHARD / shardEnded SHARD
 *   checkpointError SHARD ERROR  a checkpoint the daemon refused
 *
 * It checkpoints the last record of every batch by its sequence number (as aws-kcl's sample
 * does), the last record delivered when a shutdown is requested, and the shard's end.
 */
'use strict';

var fs = require('fs');
var kcl = require('aws-kcl');

var OUT = process.env.AWS_KCL_TEST_OUT;

function log(line) {
  fs.appendFileSync(OUT, line + '\n');
}

var recordProcessor = {
  shard: null,
  last: null,

  initialize: function(initializeInput, completeCallback) {
    this.shard = initializeInput.shardId;
    log('start ' + this.shard + ' ' + initializeInput.sequenceNumber);
    log('pid ' + this.shard + ' ' + process.pid);
    completeCallback();
  },

  processRecords: function(processRecordsInput, completeCallback) {
    var self = this;
    if (!processRecordsInput || !processRecordsInput.records) {
      completeCallback();
      return;
    }
    var records = processRecordsInput.records;
    var sequenceNumber;
    for (var i = 0; i < records.length; ++i) {
      var record = records[i];
      sequenceNumber = record.sequenceNumber;
      var data = Buffer.from(record.data, 'base64').toString();
      log('record ' + self.shard + ' ' + sequenceNumber + ' ' + record.subSequenceNumber + ' ' +
          data);
    }
    if (!sequenceNumber) {
      completeCallback();
      return;
    }
    self.last = sequenceNumber;
    processRecordsInput.checkpointer.checkpoint(sequenceNumber, function(err, checkpointed) {
      if (err) {
        log('checkpointError ' + self.shard + ' ' + err);
      } else {
        log('checkpointed ' + self.shard + ' ' + checkpointed);
      }
      completeCallback();
    });
  },

  leaseLost: function(leaseLostInput, completeCallback) {
    log('leaseLost ' + this.shard);
    completeCallback();
  },

  shardEnded: function(shardEndedInput, completeCallback) {
    var self = this;
    log('shardEnded ' + self.shard);
    shardEndedInput.checkpointer.checkpoint(function(err) {
      if (err) {
        log('checkpointError ' + self.shard + ' ' + err);
      } else {
        log('checkpointed ' + self.shard + ' SHARD_END');
      }
      completeCallback();
    });
  },

  shutdownRequested: function(shutdownRequestedInput, completeCallback) {
    var self = this;
    log('shutdownRequested ' + self.shard);
    shutdownRequestedInput.checkpointer.checkpoint(function(err) {
      if (err) {
        log('checkpointError ' + self.shard + ' ' + err);
      } else if (self.last) {
        log('checkpointed ' + self.shard + ' ' + self.last);
      }
      completeCallback();
    });
  }
};

kcl(recordProcessor).run();
