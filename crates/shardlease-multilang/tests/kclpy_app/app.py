#!/usr/bin/env python3
"""A small amazon-kclpy application (its v3 processor API, unchanged KCL client code) for the
daemon's end-to-end test: it appends "record SHARD SEQ SUB DATA" to $KCLPY_TEST_OUT for every
record, checkpoints after each batch (retrying on ThrottlingException as the KCL samples do), at
shard end and when a shutdown is requested."""
import os
import sys
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["KCLPY_TEST_OUT"]


def log(line):
    with open(OUT, "a") as f:
        f.write(line + "\n")


def checkpoint(checkpointer, tries=5):
    for _ in range(tries):
        try:
            checkpointer.checkpoint()
            return
        except kcl.CheckpointError as e:
            if e.value == "ThrottlingException":
                time.sleep(0.2)
                continue
            sys.stderr.write("checkpoint failed: %s\n" % e.value)
            return


class App(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        log("start %s %s" % (self.shard, initialize_input.sequence_number))

    def process_records(self, process_records_input):
        for r in process_records_input.records:
            log("record %s %s %s %s" % (self.shard, r.sequence_number, r.sub_sequence_number,
                                        r.binary_data.decode()))
        checkpoint(process_records_input.checkpointer)

    def lease_lost(self, lease_lost_input):
        log("leaseLost %s" % self.shard)

    def shard_ended(self, shard_ended_input):
        log("shardEnded %s" % self.shard)
        checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input):
        log("shutdownRequested %s" % self.shard)
        checkpoint(shutdown_requested_input.checkpointer)


if __name__ == "__main__":
    kcl.KCLProcess(App()).run()
