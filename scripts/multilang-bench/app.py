#!/usr/bin/env python3
"""The record processor of scripts/multilang-bench.py: an amazon-kclpy application (its v3 API)
that counts the records it is given and checkpoints after every batch, writing
"SHARD COUNT" to $MLBENCH_OUT/SHARD after each batch (one small write per batch, so the figure
measured is the protocol's and the daemon's cost, not the app's own)."""
import os
import sys
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUT = os.environ["MLBENCH_OUT"]


class App(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        self.count = 0

    def process_records(self, process_records_input):
        records = process_records_input.records
        for r in records:
            _ = r.binary_data
        self.count += len(records)
        with open(os.path.join(OUT, self.shard), "w") as f:
            f.write("%d %f\n" % (self.count, time.time()))
        for _ in range(5):
            try:
                process_records_input.checkpointer.checkpoint()
                break
            except kcl.CheckpointError as e:
                if e.value != "ThrottlingException":
                    sys.stderr.write("checkpoint failed: %s\n" % e.value)
                    break
                time.sleep(0.1)

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


if __name__ == "__main__":
    kcl.KCLProcess(App()).run()
