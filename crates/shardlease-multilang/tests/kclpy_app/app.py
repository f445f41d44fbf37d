#!/usr/bin/env python3
"""A small amazon-kclpy application (its v3 processor API, unchanged KCL client code) for the
daemon's end-to-end test: it appends "record SHARD SEQ SUB DATA" to $KCLPY_TEST_OUT for every
record, checkpoints after each batch (retrying on ThrottlingException as the KCL samples do), at
shard end and when a shutdown is requested, and logs "checkpointed SHARD SEQ" (SEQ the last record
delivered, or SHARD_END) once the daemon has confirmed a checkpoint, and "pid SHARD PID" when it
starts. With $KCLPY_TEST_CHECKPOINT_EVERY = N it checkpoints after every Nth batch only (records
past the checkpoint are then redone after a crash)."""
import os
import sys
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["KCLPY_TEST_OUT"]
EVERY = int(os.environ.get("KCLPY_TEST_CHECKPOINT_EVERY", "1"))


def log(line):
    with open(OUT, "a") as f:
        f.write(line + "\n")


def checkpoint(checkpointer, tries=5):
    """Checkpoints at the last record delivered; whether the daemon confirmed it."""
    for _ in range(tries):
        try:
            checkpointer.checkpoint()
            return True
        except kcl.CheckpointError as e:
            if e.value == "ThrottlingException":
                time.sleep(0.2)
                continue
            sys.stderr.write("checkpoint failed: %s\n" % e.value)
            return False
    return False


class App(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        self.last = None
        self.batches = 0
        log("start %s %s" % (self.shard, initialize_input.sequence_number))
        log("pid %s %d" % (self.shard, os.getpid()))

    def process_records(self, process_records_input):
        for r in process_records_input.records:
            log("record %s %s %s %s" % (self.shard, r.sequence_number, r.sub_sequence_number,
                                        r.binary_data.decode()))
            self.last = r.sequence_number
        self.batches += 1
        if self.batches % EVERY != 0:
            return
        if checkpoint(process_records_input.checkpointer) and self.last is not None:
            log("checkpointed %s %s" % (self.shard, self.last))

    def lease_lost(self, lease_lost_input):
        log("leaseLost %s" % self.shard)

    def shard_ended(self, shard_ended_input):
        log("shardEnded %s" % self.shard)
        if checkpoint(shard_ended_input.checkpointer):
            log("checkpointed %s SHARD_END" % self.shard)

    def shutdown_requested(self, shutdown_requested_input):
        log("shutdownRequested %s" % self.shard)
        if checkpoint(shutdown_requested_input.checkpointer) and self.last is not None:
            log("checkpointed %s %s" % (self.shard, self.last))


if __name__ == "__main__":
    kcl.KCLProcess(App()).run()
