"""Crash test of keyed process functions (DESIGN.md section 1): exactly-once
effects of acknowledged batches across SIGKILL.

Four producers push numbered batches (50-200 rows over 30 keys of a
running_sum function, strictly increasing sequence numbers per producer)
over gRPC while another thread SIGKILLs keyflowd mid-stream and restarts it
(twice). Each producer retries its unacknowledged batch with the same
producer_id, sequence and rows, then goes on. At the end every batch is
acknowledged, and:

  - every input row of every batch appears exactly once in the output
    (each row's ts is unique and encodes (producer, batch, row index), so an
    output row maps back to its input row), with its key;
  - each batch's rows are contiguous and in row order, at the output
    sequences its ack names, and each producer's batches appear in sequence
    order;
  - the output equals a reference run of running_sum over the batches in the
    order the server applied them (reconstructed from the output itself): per
    key, the sums are the prefix sums of that key's amounts in output order;
  - GetKeyState of every key is its last sum; the function's output_seq,
    keys and watermark match; the last sequence of every producer is still
    answered with its original ack (duplicate=true).

The same test runs three ways: at one partition; at the default 8
partitions with a SINGLE function (the default placement: every check
above holds as at one partition); and at 8 partitions with a SPLIT
function, where each batch is one step per partition it reaches, so kills
land between the partitions' writes of a batch, and the producers' retries
must complete such batches without applying any part twice
(docs/semantics.md, "Split functions"): every input row once in the
partitions' output, each key's sums the prefix sums of its rows in batch
order, every key's state its total.

Run:
  cd <repo> && KEYFLOW_BUILD_DIR=build-fe2e PYENV_VERSION=system python3 -m unittest \
      discover -s tests/crash -p 'test_crash_functions.py' -v
KEYFLOW_CRASH_SEED sets the random seed (printed on failure).
"""

import os
import random
import sys
import threading
import time
import unittest

import grpc  # before harness.stubs(): the stubs hold a package named grpc too

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import harness  # noqa: E402
import test_functions_grpc as tf  # noqa: E402

PRODUCERS = 4
BATCHES = 40          # per producer
KEYS = 30
MIN_ROWS, MAX_ROWS = 50, 200
KILLS = 2
PUSH_TIMEOUT_S = 20
WAIT_S = 120          # bound on every condition wait


def encode_ts(p, s, i):
    """A unique event time naming (producer, batch number, row index)."""
    return ((p + 1) * 1000000 + s) * 1000 + i


def decode_ts(ts):
    return ts // 1000000000 - 1, (ts // 1000) % 1000000, ts % 1000


def sequence_of(s):
    """Producer sequence of batch number s: strictly increasing, with gaps."""
    return 3 * s + 1


class CrashFunctionsTest(unittest.TestCase):
    # One partition: the verification reads the output as one sequence
    # over all keys (contiguous batches at their acks' first/last output
    # seqs; harness.ONE_PARTITION says why).
    ARGS = harness.ONE_PARTITION
    PLACEMENT = None  # the descriptor's default: SINGLE

    def setUp(self):
        tf.require_build(self)
        tf.load_stubs()
        self.pb, self.pg = tf.pb, tf.pg
        self.seed = int(os.environ.get("KEYFLOW_CRASH_SEED", "20240611"))
        self.server = harness.Keyflowd(args=self.ARGS + ["--plugin-dir", tf.HANDLERS]).start()
        self.addCleanup(self.server.cleanup)

    def msg(self, text):
        return "%s (seed %d)\nserver log:\n%s" % (text, self.seed, self.server.read_log()[-4000:])

    def test_sigkill_mid_stream_exactly_once(self):
        pb, pg = self.pb, self.pg
        rng = random.Random(self.seed)
        d = tf.rs_descriptor(function_id=tf.unique("crash-rs"))
        if self.PLACEMENT is not None:
            d["placement"] = self.PLACEMENT
        fields = tf.schema_fields(d, "inputSchema")
        keys = ["key-%02d" % k for k in range(KEYS)]

        channel = grpc.insecure_channel(self.server.grpc_target)
        stub = pg.FunctionsStub(channel)
        stub.RegisterFunction(pb.RegisterFunctionRequest(
            descriptor=tf.json_format.ParseDict(d, pb.FunctionDescriptor())),
            timeout=PUSH_TIMEOUT_S)
        channel.close()

        # Input: batches[p][s] (s from 1), each with its request prepared.
        batches = []
        for p in range(PRODUCERS):
            mine = {}
            for s in range(1, BATCHES + 1):
                n = rng.randint(MIN_ROWS, MAX_ROWS)
                rows = [{"user": rng.choice(keys), "ts": encode_ts(p, s, i),
                         "amount": rng.randint(-1000, 1000)} for i in range(n)]
                req = pb.PushBatchRequest(function_id=d["functionId"], producer_id="producer-%d" % p,
                                          sequence=sequence_of(s),
                                          batch=tf.to_row_batch(rows, fields),
                                          watermark_us=encode_ts(p, s, 0))
                mine[s] = (rows, req)
            batches.append(mine)
        total_batches = PRODUCERS * BATCHES

        # Shared state, under `cond`.
        cond = threading.Condition()
        shared = {"gen": 0, "target": self.server.grpc_target, "acked": 0, "errors": [],
                  "failed_calls": 0, "duplicates": 0, "kills_at": [], "done": False}
        acks = [dict() for _ in range(PRODUCERS)]    # p -> s -> PushBatchResponse

        def producer(p):
            channel, gen = None, -1
            try:
                s = 1
                while s <= BATCHES:
                    with cond:
                        if shared["gen"] != gen:
                            if channel is not None:
                                channel.close()
                            gen, target = shared["gen"], shared["target"]
                            channel = grpc.insecure_channel(target)
                            stub = pg.FunctionsStub(channel)
                    try:
                        ack = stub.PushBatch(batches[p][s][1], timeout=PUSH_TIMEOUT_S)
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                            grpc.StatusCode.CANCELLED,
                                            grpc.StatusCode.UNKNOWN,
                                            grpc.StatusCode.DEADLINE_EXCEEDED):
                            raise
                        # The server is gone: wait for the restart, then
                        # retry the same batch (same producer, sequence, rows).
                        with cond:
                            shared["failed_calls"] += 1
                            if not cond.wait_for(lambda: shared["gen"] != gen, timeout=WAIT_S):
                                raise AssertionError(
                                    "producer %d: batch %d failed with %s %s and the server "
                                    "was not restarted" % (p, s, e.code(), e.details()))
                        continue
                    with cond:
                        acks[p][s] = ack
                        shared["acked"] += 1
                        shared["duplicates"] += int(ack.duplicate)
                        cond.notify_all()
                    s += 1
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                with cond:
                    shared["errors"].append("producer %d: %r" % (p, e))
                    cond.notify_all()
            finally:
                if channel is not None:
                    channel.close()

        def killer():
            try:
                for k in range(KILLS):
                    threshold = total_batches * (k + 1) // (KILLS + 1)
                    with cond:
                        if not cond.wait_for(lambda: shared["acked"] >= threshold
                                             or shared["errors"], timeout=WAIT_S):
                            raise AssertionError("only %d batches acked before kill %d"
                                                 % (shared["acked"], k))
                        if shared["errors"]:
                            return
                        shared["kills_at"].append(shared["acked"])
                    self.server.kill()       # SIGKILL while producers push
                    self.server.start()
                    with cond:
                        shared["gen"] += 1
                        shared["target"] = self.server.grpc_target
                        cond.notify_all()
            except Exception as e:  # noqa: BLE001
                with cond:
                    shared["errors"].append("killer: %r" % e)
                    cond.notify_all()

        threads = [threading.Thread(target=producer, args=(p,), daemon=True)
                   for p in range(PRODUCERS)]
        threads.append(threading.Thread(target=killer, daemon=True))
        for t in threads:
            t.start()
        deadline = time.monotonic() + 4 * WAIT_S
        for t in threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
            self.assertFalse(t.is_alive(), self.msg("a producer or the killer hung"))
        self.assertEqual(shared["errors"], [], self.msg("errors while pushing"))
        self.assertEqual(len(shared["kills_at"]), KILLS)
        self.assertTrue(all(0 < a < total_batches for a in shared["kills_at"]),
                        self.msg("kills were not mid-stream: %r" % shared["kills_at"]))
        self.assertGreater(shared["failed_calls"], 0,
                           self.msg("no push was interrupted by the kills"))
        self.assertEqual(shared["acked"], total_batches)
        sys.stderr.write("[%d batches, kills after %s acks, %d interrupted pushes, %d retries "
                         "answered as duplicates, seed %d] "
                         % (total_batches, shared["kills_at"], shared["failed_calls"],
                            shared["duplicates"], self.seed))

        self.verify(d, batches, acks)

    # --- verification ----------------------------------------------------------

    def verify(self, d, batches, acks):
        pb, pg = self.pb, self.pg
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        stub = pg.FunctionsStub(channel)
        out_fields = tf.schema_fields(d, "outputSchema")

        output, after = [], 0
        while True:
            resp = stub.ReadOutput(pb.ReadOutputRequest(function_id=d["functionId"],
                                                        after_seq=after, limit=5000), timeout=60)
            if resp.first_seq == 0:
                break
            self.assertEqual(resp.first_seq, after + 1)
            rows = tf.from_row_batch(resp.batch, out_fields)
            for i, r in enumerate(rows):
                r["_seq"] = resp.first_seq + i
            output += rows
            after = resp.next_after_seq
        total_rows = sum(len(rows) for mine in batches for rows, _ in mine.values())
        self.assertEqual(len(output), total_rows, self.msg("output has the wrong row count"))
        self.assertEqual([r["_seq"] for r in output], list(range(1, total_rows + 1)))

        # Every input row exactly once, with its key.
        where = {}   # (p, s, i) -> output position
        for pos, r in enumerate(output):
            p, s, i = decode_ts(r["ts"])
            self.assertTrue(0 <= p < PRODUCERS and s in batches[p] and
                            i < len(batches[p][s][0]),
                            self.msg("output row %r maps to no input row" % r))
            self.assertNotIn((p, s, i), where, self.msg("input row %r applied twice" % ((p, s, i),)))
            where[(p, s, i)] = pos
            self.assertEqual(r["key"], batches[p][s][0][i]["user"])
        self.assertEqual(len(where), total_rows)

        # Each batch contiguous, in row order, where its ack says; each
        # producer's batches in sequence order.
        batch_order = []
        for p in range(PRODUCERS):
            last_first = 0
            for s in range(1, BATCHES + 1):
                rows = batches[p][s][0]
                positions = [where[(p, s, i)] for i in range(len(rows))]
                first = positions[0] + 1
                self.assertEqual(positions, list(range(first - 1, first - 1 + len(rows))),
                                 self.msg("batch %d of producer %d is not contiguous" % (s, p)))
                ack = acks[p][s]
                self.assertEqual((ack.rows_accepted, ack.activations, ack.first_output_seq,
                                  ack.last_output_seq, ack.sequence),
                                 (len(rows), len(rows), first, first + len(rows) - 1,
                                  sequence_of(s)),
                                 self.msg("ack of batch %d of producer %d" % (s, p)))
                self.assertGreater(first, last_first,
                                   self.msg("producer %d: batch %d applied before batch %d"
                                            % (p, s, s - 1)))
                last_first = first
                batch_order.append((first, p, s))
        batch_order.sort()

        # The reference computation over the batches in the server's order.
        model = tf.RunningSumModel()
        for _, p, s in batch_order:
            model.push(batches[p][s][0])
        self.assertEqual([{k: v for k, v in r.items() if k != "_seq"} for r in output],
                         model.output, self.msg("output differs from the reference"))
        sums = {}
        for r in output:
            p, s, i = decode_ts(r["ts"])
            sums.setdefault(r["key"], 0)
            sums[r["key"]] += batches[p][s][0][i]["amount"]
            self.assertEqual(r["sum"], sums[r["key"]])

        # Key state, function info, producer sequences.
        for k, total in sums.items():
            st = stub.GetKeyState(pb.GetKeyStateRequest(function_id=d["functionId"], key=k),
                                  timeout=30)
            self.assertEqual((st.state, st.value), (pb.STATE_KIND_VALUE, total), k)
        info = stub.GetFunction(pb.GetFunctionRequest(function_id=d["functionId"]), timeout=30)
        max_wm = max(encode_ts(p, s, 0) for p in range(PRODUCERS) for s in batches[p])
        self.assertEqual((info.output_seq, info.keys, info.watermark_us, info.timers),
                         (total_rows, len(sums), max_wm, 0))
        for p in range(PRODUCERS):
            again = stub.PushBatch(batches[p][BATCHES][1], timeout=PUSH_TIMEOUT_S)
            self.assertTrue(again.duplicate)
            orig = acks[p][BATCHES]
            for f in ("rows_accepted", "activations", "handler_calls", "first_output_seq",
                      "last_output_seq", "sequence"):
                self.assertEqual(getattr(again, f), getattr(orig, f), f)
        info2 = stub.GetFunction(pb.GetFunctionRequest(function_id=d["functionId"]), timeout=30)
        self.assertEqual(info2.output_seq, total_rows)


class SingleAtDefaultPartitions(CrashFunctionsTest):
    """The default 8 partitions, a SINGLE function: one sequence, as at P = 1."""
    ARGS = []


class SplitAtDefaultPartitions(CrashFunctionsTest):
    """The default 8 partitions, a SPLIT function: kills land between the
    partitions' writes of a batch; retries complete it exactly once."""
    ARGS = []
    PLACEMENT = "PLACEMENT_SPLIT"

    def verify(self, d, batches, acks):
        pb, pg = self.pb, self.pg
        channel = grpc.insecure_channel(self.server.grpc_target)
        self.addCleanup(channel.close)
        stub = pg.FunctionsStub(channel)
        out_fields = tf.schema_fields(d, "outputSchema")
        # Every partition's output, behind the cursor, each in its order.
        by_partition, cursor = {}, ""
        for _ in range(100000):
            resp = stub.ReadOutput(pb.ReadOutputRequest(function_id=d["functionId"],
                                                        cursor=cursor, limit=5000), timeout=60)
            if resp.first_seq == 0:
                break
            mine = by_partition.setdefault(resp.partition, [])
            rows = tf.from_row_batch(resp.batch, out_fields)
            for i, r in enumerate(rows):
                r["_seq"] = resp.first_seq + i
            self.assertEqual(resp.first_seq, (mine[-1]["_seq"] if mine else 0) + 1,
                             self.msg("partition %d's output has a gap" % resp.partition))
            mine += rows
            cursor = resp.next_cursor
        total_rows = sum(len(rows) for mine in batches for rows, _ in mine.values())
        seen = set()
        sums, last_batch = {}, {}
        for partition, rows in sorted(by_partition.items()):
            for r in rows:
                p, s, i = decode_ts(r["ts"])
                self.assertTrue(0 <= p < PRODUCERS and s in batches[p] and
                                i < len(batches[p][s][0]),
                                self.msg("output row %r maps to no input row" % r))
                self.assertNotIn((p, s, i), seen,
                                 self.msg("input row %r applied twice" % ((p, s, i),)))
                seen.add((p, s, i))
                row = batches[p][s][0][i]
                self.assertEqual(r["key"], row["user"])
                # A producer's rows of one key come in batch and row order.
                self.assertGreaterEqual((s, i), last_batch.get((p, r["key"]), (0, -1)),
                                        self.msg("producer %d's rows of %s out of order"
                                                 % (p, r["key"])))
                last_batch[(p, r["key"])] = (s, i)
                sums[r["key"]] = sums.get(r["key"], 0) + row["amount"]
                self.assertEqual(r["sum"], sums[r["key"]], self.msg("sum of %s" % r["key"]))
        self.assertEqual(len(seen), total_rows, self.msg("rows missing from the output"))
        for k, total in sums.items():
            st = stub.GetKeyState(pb.GetKeyStateRequest(function_id=d["functionId"], key=k),
                                  timeout=30)
            self.assertEqual((st.state, st.value), (pb.STATE_KIND_VALUE, total), k)
        info = stub.GetFunction(pb.GetFunctionRequest(function_id=d["functionId"]), timeout=30)
        self.assertEqual((info.output_seq, info.keys, info.placement),
                         (total_rows, len(sums), pb.PLACEMENT_SPLIT))
        self.assertGreater(len(by_partition), 1, "the keys spread over the partitions")
        for p in range(PRODUCERS):
            again = stub.PushBatch(batches[p][BATCHES][1], timeout=PUSH_TIMEOUT_S)
            self.assertTrue(again.duplicate)
        info2 = stub.GetFunction(pb.GetFunctionRequest(function_id=d["functionId"]), timeout=30)
        self.assertEqual(info2.output_seq, total_rows)


if __name__ == "__main__":
    unittest.main()
