#!/usr/bin/env python3
"""A scripted MultiLang child for the daemon's fault tests (standard library only).

Usage: scripted.py OUT_DIR FAULT

It speaks the protocol like a well-behaved KCL client: it appends one line per event to
OUT_DIR/events.log ("start SHARD PID", "record SHARD SEQ SUB DATA", "shutdownRequested SHARD",
"leaseLost SHARD", "shardEnded SHARD") and checkpoints after every batch with no sequence number.

FAULT makes exactly one child (the first to create OUT_DIR/fault.claimed) misbehave once, on its
first processRecords: crash (exit 3), notjson (print a stray line), wrongresp (answer
"initialize"), unknown (send an unknown action), hang (never answer), or, for ignoreeof, every
child ignores EOF after its last message. "none" never misbehaves.
"""
import base64
import json
import os
import sys
import time

out_dir, fault = sys.argv[1], sys.argv[2]
log_path = os.path.join(out_dir, "events.log")


def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")


def send(obj):
    # As kclpy does: a line feed before and after each message.
    sys.stdout.write("\n" + json.dumps(obj) + "\n")
    sys.stdout.flush()


def read():
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)


def claim_fault():
    if fault in ("none", "ignoreeof"):
        return False
    try:
        fd = os.open(os.path.join(out_dir, "fault.claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        return True
    except FileExistsError:
        return False


def checkpoint(seq=None, sub=None):
    send({"action": "checkpoint", "sequenceNumber": seq, "subSequenceNumber": sub})
    reply = read()
    if reply is None or reply.get("action") != "checkpoint":
        sys.stderr.write("bad checkpoint reply %r\n" % (reply,))
        sys.exit(4)
    return reply.get("error")


shard = None
while True:
    msg = read()
    if msg is None:
        if fault == "ignoreeof":
            sys.stderr.write("ignoring EOF\n")
            sys.stderr.flush()
            while True:
                time.sleep(3600)
        break
    action = msg["action"]
    if action == "initialize":
        shard = msg["shardId"]
        # Every field is present (kclpy indexes them).
        assert "sequenceNumber" in msg and "subSequenceNumber" in msg
        log("start %s %d %s" % (shard, os.getpid(), msg["sequenceNumber"]))
        sys.stderr.write("initialized %s\n" % shard)
        sys.stderr.flush()
    elif action == "processRecords":
        assert "millisBehindLatest" in msg
        if claim_fault():
            log("fault %s %s" % (shard, fault))
            if fault == "crash":
                sys.exit(3)
            if fault == "notjson":
                sys.stdout.write("this is not JSON\n")
                sys.stdout.flush()
                time.sleep(3600)
            if fault == "wrongresp":
                send({"action": "status", "responseFor": "initialize"})
                time.sleep(3600)
            if fault == "unknown":
                send({"action": "bogus"})
                time.sleep(3600)
            if fault == "hang":
                time.sleep(3600)
        for r in msg["records"]:
            assert r["action"] == "record"
            data = base64.b64decode(r["data"]).decode()
            log("record %s %s %s %s" % (shard, r["sequenceNumber"], r["subSequenceNumber"], data))
        error = checkpoint()
        if error is not None:
            log("checkpointError %s %s" % (shard, error))
    elif action == "shutdownRequested":
        log("shutdownRequested %s" % shard)
        checkpoint()
    elif action == "leaseLost":
        log("leaseLost %s" % shard)
    elif action == "shardEnded":
        log("shardEnded %s" % shard)
        checkpoint()
    send({"action": "status", "responseFor": action})
