"""The Python client, end to end against a real entrokvd on loopback."""

import concurrent.futures
import os
import signal
import subprocess
import sys
import unittest

import json
import tempfile

import numpy as np

import entrokv
from entrokv.v1 import cache_manager_pb2 as pb
from entrokv.v1 import types_pb2 as types

GEOMETRY = dict(layers=3, query_heads=6, kv_groups=2, head_dim=32, page_size=16)
FRAME_BYTES = 2 * 16 * 32 * 2  # K and V, B tokens, head_dim, 2-byte elements


class Daemon:
    """entrokvd on 127.0.0.1:0, stopped with SIGTERM."""

    def __init__(self):
        self.process = subprocess.Popen(
            [os.environ["ENTROKVD"], "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        addresses = entrokv.parse_listening_line(line)
        if addresses is None or addresses.metrics is None:
            self.process.kill()
            raise RuntimeError(f"entrokvd did not start: {line!r} {self.process.stderr.read()}")
        self.address, self.metrics = addresses.address, addresses.metrics

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def layer_stats(seed: int, tokens: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.random((GEOMETRY["layers"], GEOMETRY["query_heads"], tokens), dtype=np.float32)
    rows[:, 0, 7] = 50.0  # one focused head per layer
    return rows / rows.sum(axis=2, keepdims=True)


class ListeningLineTest(unittest.TestCase):
    def test_the_start_up_line_gives_both_addresses(self):
        self.assertEqual(
            entrokv.parse_listening_line("log\nentrokvd listening on 127.0.0.1:41231 metrics on "
                                         "127.0.0.1:39017\n"),
            entrokv.DaemonAddresses("127.0.0.1:41231", "127.0.0.1:39017"))
        self.assertEqual(
            entrokv.parse_listening_line("entrokvd listening on [::1]:5005 metrics off\n"),
            entrokv.DaemonAddresses("[::1]:5005", None))

    def test_nothing_until_the_line_is_complete(self):
        for text in ("", "entrokvd listening on 127.0.0.1:41231 metrics on 127.0.0.1:39",
                     "entrokvd stopped\n", "xentrokvd listening on 1:2 metrics off\n"):
            self.assertIsNone(entrokv.parse_listening_line(text), text)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = entrokv.Client(cls.daemon.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        exit_code = cls.daemon.stop()
        if exit_code != 0:
            raise AssertionError(f"entrokvd exited with {exit_code} after SIGTERM")

    def register(self, model_id: str, frames: int = 4096):
        return self.client.register_model(model_id, capacity_bytes=frames * FRAME_BYTES,
                                          **GEOMETRY)

    def select_offline(self, stats: np.ndarray, *flags: str) -> list:
        """`entrokv select` on `stats` (2 KV heads, pages of 16 tokens) with `flags`: its
        JSON's layers."""
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "stats.npy")
            np.save(path, stats)
            result = subprocess.run(
                [os.environ["ENTROKV_CLI"], "select", "--stats", path, "--kv-heads", "2",
                 "--page-size", "16", *flags],
                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout)["layers"]

    def assert_pool_consistent(self, model_id: str):
        stats = self.client.pool_stats(model_id)
        self.assertEqual(stats.used_frames + stats.free_frames, stats.capacity_frames)
        return stats

    def test_tensor_parallel_ranks_decide_together(self):
        # Two ranks, each with one of the 2 KV groups and 3 of the 6 query heads, each on its
        # own thread, as two worker processes would call: both get the one-pool decision.
        single = self.client.register_model("tp1", capacity_bytes=4096 * 2 * FRAME_BYTES,
                                            frame_layout="layer", **GEOMETRY)
        pool = self.client.register_model("tp2", capacity_bytes=4096 * 2 * FRAME_BYTES,
                                          frame_layout="layer", tensor_parallel_size=2,
                                          devices=[0, 0], **GEOMETRY)
        self.assertEqual(len(single.ranks), 1)
        self.assertEqual([(r.rank, r.device) for r in pool.ranks], [(0, 0), (1, 0)])
        self.assertEqual(pool.ranks[0].frame_bytes * 2, pool.frame_bytes)
        self.assertEqual(pool.ranks[0].arena_name, pool.arena_name)
        stats = layer_stats(5, 300)
        for model in ("tp1", "tp2"):
            self.client.open_sequence(model, "s", initial_tokens=300)
        alone = self.client.decide("tp1", "s", stats, pages=6, scope="group")
        half = GEOMETRY["query_heads"] // 2
        with concurrent.futures.ThreadPoolExecutor(2) as pool_threads:
            calls = [pool_threads.submit(self.client.decide, "tp2", "s",
                                         stats[:, rank * half:(rank + 1) * half], pages=6,
                                         scope="group", rank=rank) for rank in (0, 1)]
            together = [call.result(timeout=30) for call in calls]
        for decisions in together:
            for mine, reference in zip(decisions, alone):
                for group, expected in zip(mine.groups, reference.groups):
                    np.testing.assert_array_equal(group.kept_pages, expected.kept_pages)
        with self.assertRaises(entrokv.InvalidArgumentError) as raised:
            self.client.decide("tp2", "s", stats, pages=6, rank=2)
        self.assertIn("rank", str(raised.exception))
        # Each rank's own DecideStream, layer by layer: the same decision, layer by layer.
        for model in ("tp1", "tp2"):
            self.client.close_sequence(model, "s")
            self.client.open_sequence(model, "s", initial_tokens=300)
        alone = list(self.client.decide_stream("tp1", "s", list(enumerate(stats)), pages=6,
                                               scope="group"))

        def stream(rank):
            mine = [(layer, stats[layer, rank * half:(rank + 1) * half])
                    for layer in range(len(stats))]
            return list(self.client.decide_stream("tp2", "s", mine, pages=6, scope="group",
                                                  rank=rank))

        with concurrent.futures.ThreadPoolExecutor(2) as pool_threads:
            streamed = [call.result(timeout=30)
                        for call in [pool_threads.submit(stream, rank) for rank in (0, 1)]]
        for decisions in streamed:
            self.assertEqual(len(decisions), len(alone))
            for mine, reference in zip(decisions, alone):
                for group, expected in zip(mine.groups, reference.groups):
                    np.testing.assert_array_equal(group.kept_pages, expected.kept_pages)
        with self.assertRaisesRegex(ValueError, "rank"):
            list(self.client.decide_stream("tp2", "s", list(enumerate(stats)), pages=6, rank=-1))

    def test_whole_lifecycle_with_decide(self):
        pool = self.register("lifecycle")
        self.assertIsInstance(pool, entrokv.PoolInfo)
        self.assertEqual(pool.frame_bytes, FRAME_BYTES)
        self.assertEqual((pool.frame_layout, pool.backend), ("group", "host"))
        self.assertEqual(pool.geometry, entrokv.ModelGeometry(element_bytes=2, **GEOMETRY))
        self.assertEqual(self.client.get_model("lifecycle"), pool)
        self.assertIn("lifecycle", [p.model_id for p in self.client.list_models()])
        opened = self.client.open_sequence("lifecycle", "s1", initial_tokens=0)
        self.assertEqual(opened, entrokv.SequenceInfo("s1", 0, 0, []))
        self.assertEqual(self.client.append_tokens("lifecycle", "s1", 500), 500)
        pages = -(-500 // 16)
        stats = self.assert_pool_consistent("lifecycle")
        self.assertIsInstance(stats, entrokv.PoolStats)
        self.assertEqual(stats.used_frames, GEOMETRY["layers"] * GEOMETRY["kv_groups"] * pages)
        self.assertEqual(sum(stats.used_frames_per_layer), stats.used_frames)

        decisions = self.client.decide("lifecycle", "s1", layer_stats(1, 500), pages=5,
                                       policy="page_entrokv", protect_tail_page=False)
        self.assertEqual([d.layer for d in decisions], [0, 1, 2])
        for decision in decisions:
            self.assertEqual(decision.tokens, 500)
            self.assertEqual(decision.page_count, pages)
            for group in decision.groups:
                self.assertEqual(group.kept_pages.dtype, np.int32)
                self.assertEqual(len(group.kept_pages), 5)
                self.assertTrue(np.all(np.diff(group.kept_pages) > 0))
                self.assertEqual(len(group.kept_pages) + len(group.evicted_pages), pages)
                self.assertAlmostEqual(float(group.weights.sum()), 1.0, places=9)
                self.assertEqual(len(group.entropies), 3)
                self.assertGreaterEqual(group.shadow_uor, 1.0)
            # The focused head's token 7 is on page 0: group 0 keeps it.
            self.assertIn(0, decision.groups[0].kept_pages)
        stats = self.assert_pool_consistent("lifecycle")
        self.assertEqual(stats.used_frames, GEOMETRY["layers"] * GEOMETRY["kv_groups"] * 5)
        self.assertEqual(stats.bytes_moved_total, 0)

        sequences = self.client.list_sequences("lifecycle", block_tables=True)
        self.assertEqual([s.sequence_id for s in sequences], ["s1"])
        self.assertIsInstance(sequences[0], entrokv.SequenceInfo)
        self.assertEqual(len(sequences[0].block_tables), 6)
        self.assertEqual(sequences[0].block_tables[0].frames.dtype, np.int32)
        live = [f for table in sequences[0].block_tables for f in table.frames if f >= 0]
        self.assertEqual(len(live), 30)

        self.assertEqual(self.client.close_sequence("lifecycle", "s1"), 30)
        self.assertEqual(self.assert_pool_consistent("lifecycle").used_frames, 0)

    def test_unregister_model_refuses_open_sequences_unless_forced(self):
        self.register("leaving", frames=64)
        self.client.open_sequence("leaving", "a", initial_tokens=20)
        self.client.open_sequence("leaving", "b")
        with self.assertRaises(entrokv.FailedPreconditionError) as refused:
            self.client.unregister_model("leaving")
        self.assertIn("force", str(refused.exception))
        self.assertEqual(self.client.pool_stats("leaving").sequences_active, 2)  # unchanged
        self.assertEqual(self.client.unregister_model("leaving", force=True), 2)
        self.assertNotIn("leaving", [p.model_id for p in self.client.list_models()])
        with self.assertRaises(entrokv.NotFoundError):
            self.client.pool_stats("leaving")
        with self.assertRaises(entrokv.NotFoundError):
            self.client.unregister_model("leaving")
        # The id is free again, with an empty pool; a model without sequences goes unforced.
        self.register("leaving", frames=64)
        self.assertEqual(self.client.pool_stats("leaving").sequences_active, 0)
        self.assertEqual(self.client.unregister_model("leaving"), 0)

    def test_sequences_are_listed_page_by_page(self):
        self.register("paged", frames=4096)
        ids = [f"seq-{i:03d}" for i in range(250)]
        for sequence_id in reversed(ids):
            self.client.open_sequence("paged", sequence_id, initial_tokens=1)
        # 250 sequences are more than one default page (100): list_sequences follows the pages.
        self.assertEqual([s.sequence_id for s in self.client.list_sequences("paged")], ids)
        pages = self.client.iter_sequences("paged", page_size=7)
        self.assertEqual([next(pages).sequence_id for _ in range(10)], ids[:10])
        # Closing what was listed and what is still ahead, between pages, neither repeats nor
        # skips a sequence that stays open.
        self.client.close_sequence("paged", ids[3])
        self.client.close_sequence("paged", ids[200])
        rest = [s.sequence_id for s in pages]
        self.assertEqual(rest, [i for i in ids[10:] if i != ids[200]])
        stats = self.client.pool_stats("paged")
        self.assertGreater(stats.bookkeeping_bytes, 0)
        with self.assertRaises(entrokv.InvalidArgumentError) as bad:
            list(self.client.iter_sequences("paged", page_size=-1))
        self.assertIn("page_size", str(bad.exception))

    def test_stream_matches_unary_decide(self):
        self.register("stream")
        stats = layer_stats(2, 300)
        for sequence in ("unary", "streamed"):
            self.client.open_sequence("stream", sequence, initial_tokens=300)
        unary = self.client.decide("stream", "unary", stats, fraction=0.3)
        streamed = list(self.client.decide_stream(
            "stream", "streamed", ((layer, stats[layer]) for layer in range(3)), fraction=0.3))
        self.assertEqual(len(streamed), 3)
        for a, b in zip(unary, streamed):
            self.assertEqual(a.quota_pages, b.quota_pages)
            for ga, gb in zip(a.groups, b.groups):
                np.testing.assert_array_equal(ga.kept_pages, gb.kept_pages)
                np.testing.assert_allclose(ga.weights, gb.weights)

    def test_a_pyramid_budget_keeps_more_pages_in_lower_layers(self):
        self.register("pyramid")
        stats = layer_stats(2, 300)
        quotas = {}
        for allocator in (None, "uniform", "pyramid"):
            sequence = f"s-{allocator}"
            self.client.open_sequence("pyramid", sequence, initial_tokens=300)
            decisions = list(self.client.decide_stream(
                "pyramid", sequence, ((layer, stats[layer]) for layer in range(3)),
                fraction=0.3, allocator=allocator))
            quotas[allocator] = [d.quota_pages for d in decisions]
        self.assertEqual(quotas[None], quotas["uniform"])
        self.assertLessEqual(max(quotas["uniform"]) - min(quotas["uniform"]), 1)  # Hamilton
        self.assertGreater(quotas["pyramid"][0] - quotas["pyramid"][-1], 1)
        self.assertEqual(sum(quotas["pyramid"]), sum(quotas["uniform"]))
        self.assertGreater(quotas["pyramid"][0], quotas["pyramid"][-1])
        self.assertEqual(quotas["pyramid"], sorted(quotas["pyramid"], reverse=True))
        self.client.open_sequence("pyramid", "bad", initial_tokens=300)
        with self.assertRaises(entrokv.InvalidArgumentError) as bad:
            self.client.decide("pyramid", "bad", stats, fraction=0.3, allocator="triangle")
        self.assertIn("budget.allocator", str(bad.exception))
        with self.assertRaises(ValueError):
            self.client.decide("pyramid", "bad", stats, pages=3, allocator="pyramid")
        pool = self.client.pool_stats("pyramid")
        self.assertEqual(pool.used_frames + pool.free_frames, pool.capacity_frames)

    def test_a_mass_budget_moves_pages_to_the_layers_that_spread_their_attention(self):
        self.register("mass")
        stats = np.zeros((GEOMETRY["layers"], GEOMETRY["query_heads"], 320), dtype=np.float32)
        stats[0, :, 5] = 1.0  # layer 0 attends to one token
        stats[1:] = 1.0 / 320  # the others spread evenly
        quotas = {}
        for allocator, floor in ((None, None), ("mass", 0.25), ("mass", None)):
            sequence = f"s-{allocator}-{floor}"
            self.client.open_sequence("mass", sequence, initial_tokens=320)
            decisions = self.client.decide("mass", sequence, stats, fraction=0.3,
                                           allocator=allocator, layer_floor=floor,
                                           protect_tail_page=False)
            quotas[(allocator, floor)] = [d.quota_pages for d in decisions]
        uniform, moved, default = quotas[(None, None)], quotas[("mass", 0.25)], quotas[("mass", None)]
        self.assertEqual(sum(moved), sum(uniform))
        self.assertEqual(sum(default), sum(uniform))
        self.assertEqual(moved[0], 1)  # a quarter of the mean, then nothing more to keep there
        self.assertLess(moved[0], default[0])  # the default floor keeps half the mean
        self.assertGreater(min(moved[1:]), max(uniform))
        with self.assertRaises(ValueError):
            self.client.decide("mass", "s-None-None", stats, fraction=0.3, layer_floor=0.5)
        with self.assertRaises(entrokv.InvalidArgumentError) as bad:
            self.client.decide("mass", "s-None-None", stats, fraction=0.3, allocator="mass",
                               layer_floor=2.0)
        self.assertIn("budget.layer_floor", str(bad.exception))
        with self.assertRaises(entrokv.InvalidArgumentError) as stream:
            list(self.client.decide_stream("mass", "s-None-None", ((0, stats[0]),),
                                           fraction=0.3, allocator="mass"))
        self.assertIn("DecideStream", str(stream.exception))
        pool = self.client.pool_stats("mass")
        self.assertEqual(pool.used_frames + pool.free_frames, pool.capacity_frames)

    def test_a_mass_budget_through_the_daemon_is_entrokv_selects(self):
        self.register("mass-select")
        stats = layer_stats(9, 777)
        stats[0, :, :] = 0.0
        stats[0, :, 40] = 1.0  # a concentrated layer beside two random ones
        self.client.open_sequence("mass-select", "s", initial_tokens=777)
        through_daemon = self.client.decide("mass-select", "s", stats, fraction=0.2,
                                            allocator="mass", layer_floor=0.25,
                                            protect_tail_page=False)
        offline = self.select_offline(stats, "--budget", "0.2", "--allocator", "mass",
                                      "--layer-floor", "0.25")
        self.assertEqual([len(layer["groups"][0]["kept_pages"]) for layer in offline],
                         [layer.quota_pages for layer in through_daemon])
        self.assertLess(through_daemon[0].quota_pages, through_daemon[1].quota_pages)
        for cli_layer, daemon_layer in zip(offline, through_daemon):
            for cli_group, daemon_group in zip(cli_layer["groups"], daemon_layer.groups):
                self.assertEqual(cli_group["kept_pages"], daemon_group.kept_pages.tolist())
                self.assertIsNone(cli_group["uor"])  # not measured: every page was scored

    def test_half_precision_inputs(self):
        self.register("half")
        stats = layer_stats(3, 200)
        self.client.open_sequence("half", "f16", initial_tokens=200)
        self.client.open_sequence("half", "bf16", initial_tokens=200)
        self.client.open_sequence("half", "f32", initial_tokens=200)
        as_f16 = stats.astype(np.float16)
        as_bf16 = (stats.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16
        widened_bf16 = (as_bf16.astype(np.uint32) << 16).view(np.float32)
        got_f16 = self.client.decide("half", "f16", as_f16, pages=3)
        got_bf16 = self.client.decide("half", "bf16", as_bf16, pages=3, dtype="bf16")
        want_bf16 = self.client.decide("half", "f32", widened_bf16, pages=3)
        for a, b in zip(got_bf16, want_bf16):
            for ga, gb in zip(a.groups, b.groups):
                np.testing.assert_array_equal(ga.kept_pages, gb.kept_pages)
        self.assertEqual(len(got_f16[0].groups[0].kept_pages), 3)

    def test_append_tokens_frames_names_the_new_entries(self):
        self.register("frames")
        self.client.open_sequence("frames", "s", initial_tokens=20)  # pages 0 and 1 (partial)
        length, rows = self.client.append_tokens_frames("frames", "s", 30)  # 50 tokens: 2, 3 new
        self.assertEqual(length, 50)
        self.assertEqual(rows.dtype, np.int32)
        self.assertEqual(rows.shape, (GEOMETRY["layers"] * GEOMETRY["kv_groups"] * 2, 4))
        self.assertEqual(sorted(set(rows[:, 2].tolist())), [2, 3])
        tables = {(t.layer, t.group): t.frames
                  for t in self.client.list_sequences("frames", block_tables=True)[0].block_tables}
        for layer, group, page, frame in rows:
            self.assertEqual(tables[layer, group][page], frame)
        length, rows = self.client.append_tokens_frames("frames", "s", 1)  # into page 3
        self.assertEqual((length, rows.shape), (51, (0, 4)))

    def test_pool_pressure_admission_quota_and_swap(self):
        self.register("pressure", frames=60)  # 10 pages of 3 layers x 2 groups
        opened = self.client.open_sequence("pressure", "a", initial_tokens=60, priority=2,
                                           auto_floor=0.25)
        self.assertEqual((opened.priority, opened.tenant), (2, ""))
        self.assertEqual((opened.pressure.live_frames, opened.pressure.floor_frames), (24, 6))
        decisions = self.client.decide("pressure", "a", layer_stats(3, 60), auto_floor=0.25)
        self.assertEqual([len(g.kept_pages) for d in decisions for g in d.groups], [4] * 6)
        self.client.open_sequence("pressure", "b", initial_tokens=60)
        with self.assertRaises(entrokv.ResourceExhaustedError) as raised:
            self.client.open_sequence("pressure", "c", initial_tokens=60)
        hint = raised.exception.admission
        self.assertIsInstance(hint, entrokv.AdmissionHint)
        self.assertEqual((hint.outcome, hint.missing_frames), ("delayed", 12))
        self.assertGreaterEqual(hint.reclaiming_frames, 12)
        self.assertGreater(hint.retry_after_ms, 0)
        appended = self.client.append("pressure", "a", 1)  # the owner's call gives the frames
        self.assertIsInstance(appended, entrokv.Appended)
        self.assertEqual(appended.evicted.shape, (12, 3))
        self.assertEqual(appended.pressure.reclaimed_frames, 12)
        self.assertEqual(appended.new_frames.shape, (0, 4))
        info, rows, pressure = self.client.open_sequence_frames("pressure", "c", 60)
        self.assertEqual(rows.shape, (24, 4))
        stats = self.assert_pool_consistent("pressure")
        self.assertEqual(stats.admissions_delayed_total, 1)
        self.assertGreaterEqual(stats.frames_reclaimed_admission_total, 12)
        self.assertEqual(stats.tenants[-1].tenant, "")
        freed, swapped = self.client.swap_out("pressure", "c")
        self.assertEqual((freed, swapped), (24, 24 * FRAME_BYTES))
        self.assertEqual(self.client.pool_stats("pressure").sequences_swapped, 1)
        with self.assertRaisesRegex(entrokv.FailedPreconditionError, "swapped out"):
            self.client.append("pressure", "c", 1)
        info, rows, pressure = self.client.resume("pressure", "c")
        self.assertEqual((info.length_tokens, rows.shape), (60, (24, 4)))
        with self.assertRaisesRegex(entrokv.InvalidArgumentError, "priority"):
            self.client.open_sequence("pressure", "d", priority=11)
        for sequence in ("a", "b", "c"):
            self.client.close_sequence("pressure", sequence)
        self.assertEqual(self.assert_pool_consistent("pressure").used_frames, 0)

    def test_key_statistic_scores_the_keys_the_worker_wrote(self):
        # Every key of the sequence points along one direction except page 2's: keydiff keeps
        # page 2 of every (layer, group); norm keeps the page whose keys are smallest.
        pool = self.register("keys")
        self.client.open_sequence("keys", "s", initial_tokens=64)  # 4 pages
        tables = [t for s in self.client.list_sequences("keys", block_tables=True)
                  for t in s.block_tables]
        with open(os.path.join("/dev/shm", pool.arena_name.lstrip("/")), "r+b") as arena:
            for table in tables:
                for page, frame in enumerate(table.frames):
                    keys = np.zeros((16, 32), np.float16)
                    keys[:, 1 if page == 2 else 0] = 1.0 if page != 3 else 0.25
                    arena.seek(int(frame) * FRAME_BYTES)
                    arena.write(keys.tobytes())
        for score, page in (("keydiff", 2), ("norm", 3)):
            stats = [entrokv.key_statistic(GEOMETRY["query_heads"], 64, score, dtype="f16")
                     for _ in range(GEOMETRY["layers"])]
            self.client.open_sequence("keys", score, parent="s", prefix_pages=4)
            decisions = self.client.decide("keys", score, stats, pages=1, policy="mean",
                                           protect_tail_page=False)
            for decision in decisions:
                for group in decision.groups:
                    self.assertEqual(list(group.kept_pages), [page], score)
        # Expected attention with queries along dimension 1, page 2's direction, keeps page 2;
        # along dimension 0 it keeps a page of the others, not page 2.
        for direction, kept in ((1, [2]), (0, None)):
            mean = np.zeros((GEOMETRY["query_heads"], 32), np.float32)
            mean[:, direction] = 4.0
            covariance = np.tile(np.eye(32, dtype=np.float32), (GEOMETRY["query_heads"], 1, 1))
            stats = [entrokv.key_statistic(GEOMETRY["query_heads"], 64, "expected_attention",
                                           dtype="f16", query_mean=mean,
                                           query_covariance=covariance)
                     for _ in range(GEOMETRY["layers"])]
            sequence = f"expected{direction}"
            self.client.open_sequence("keys", sequence, parent="s", prefix_pages=4)
            decisions = self.client.decide("keys", sequence, stats, pages=1, policy="mean",
                                           protect_tail_page=False)
            for decision in decisions:
                for group in decision.groups:
                    if kept is None:
                        self.assertNotEqual(list(group.kept_pages), [2])
                    else:
                        self.assertEqual(list(group.kept_pages), kept)
        with self.assertRaisesRegex(ValueError, "score: 'cosine'"):
            entrokv.key_statistic(6, 64, "cosine")
        with self.assertRaisesRegex(ValueError, "query_mean"):
            entrokv.key_statistic(6, 64, "expected_attention")
        with self.assertRaisesRegex(ValueError, "only for expected_attention"):
            entrokv.key_statistic(6, 64, "keydiff", query_mean=np.zeros((6, 32)))
        # The covariance as a factor (S = F'F, here rank 1 along dimension 1) keeps what the
        # covariance diag(0, 16, 0, ...) keeps.
        mean = np.zeros((GEOMETRY["query_heads"], 32), np.float32)
        factor = np.zeros((GEOMETRY["query_heads"], 1, 32), np.float32)
        factor[:, 0, 1] = 4.0
        covariance = np.zeros((GEOMETRY["query_heads"], 32, 32), np.float32)
        covariance[:, 1, 1] = 16.0
        kept = []
        for name, spread in (("covariance", dict(query_covariance=covariance)),
                             ("factor", dict(query_covariance_factor=factor))):
            self.client.open_sequence("keys", name, parent="s", prefix_pages=4)
            stats = [entrokv.key_statistic(GEOMETRY["query_heads"], 64, "expected_attention",
                                           dtype="f16", query_mean=mean, **spread)
                     for _ in range(GEOMETRY["layers"])]
            kept.append([list(g.kept_pages) for d in self.client.decide(
                "keys", name, stats, pages=1, policy="mean", protect_tail_page=False)
                for g in d.groups])
        self.assertEqual(kept[0], kept[1])
        self.assertEqual(kept[0][0], [2])
        with self.assertRaisesRegex(ValueError, "query_covariance_factor: shape"):
            entrokv.key_statistic(6, 64, "expected_attention", query_mean=np.zeros((6, 32)),
                                  query_covariance_factor=np.zeros((6, 33, 32)))
        # A keys mix: rows that favour page 1 alone keep page 1; with keydiff's scores mixed in
        # at weight 0.9, keydiff's page 2 wins.
        rows = np.full((GEOMETRY["query_heads"], 64), 1e-3, np.float32)
        rows[:, 16:32] = 1.0
        keydiff = entrokv.key_statistic(GEOMETRY["query_heads"], 64, "keydiff", dtype="f16")

        def kept(sequence, sent, pages, **mix):
            # Every (layer, group)'s kept pages, sorted, for `sent` mixed with keydiff's scores
            # on every layer of a new child of "s" (mean pooling, the tail page unprotected).
            self.client.open_sequence("keys", sequence, parent="s", prefix_pages=4)
            stats = [entrokv.mixed_statistic(sent, keydiff, **mix)
                     for _ in range(GEOMETRY["layers"])]
            return {tuple(sorted(group.kept_pages))
                    for decision in self.client.decide("keys", sequence, stats, pages=pages,
                                                       policy="mean", protect_tail_page=False)
                    for group in decision.groups}

        for weight, page in ((None, 1), (0.9, 2)):
            self.assertEqual(kept(f"mixed{weight}", rows, 1, keys_weight=weight), {(page,)},
                             weight)
        with self.assertRaisesRegex(ValueError, "keys: a key_statistic"):
            entrokv.mixed_statistic(rows, entrokv.statistic_message(rows))
        with self.assertRaisesRegex(ValueError, "keys: .* 32 tokens"):
            entrokv.mixed_statistic(rows, entrokv.key_statistic(GEOMETRY["query_heads"], 32))
        with self.assertRaisesRegex(ValueError, "keys_weight"):
            entrokv.mixed_statistic(rows, keydiff, keys_weight=1.0)
        # The rule by name: unset is the daemon's average; a name it has not is refused here.
        self.assertFalse(entrokv.mixed_statistic(rows, keydiff).keys_mix.rule)
        self.assertEqual(entrokv.mixed_statistic(rows, keydiff, rule="max").keys_mix.rule,
                         types.KEYS_MIX_RULE_MAX)
        with self.assertRaisesRegex(ValueError, "rule: one of average, max, cover, got 'union'"):
            entrokv.mixed_statistic(rows, keydiff, rule="union")
        # The cover rule orders pages: the rows' page 1 holds their mass past the sink page, so
        # it comes first; rows with no mass there leave keydiff's order, page 2 first (its
        # ranking unpooled: pooled over 3 tokens, page 1 would borrow page 2's first token).
        outside = np.zeros_like(rows)
        outside[:, :16] = 1.0
        self.assertEqual(entrokv.mixed_statistic(rows, keydiff, rule="cover", cover_mass=0.9)
                         .keys_mix.cover_mass, 0.9)
        for sent, page in ((rows, 1), (outside, 2)):
            self.assertEqual(kept(f"covered{page}", sent, 1, rule="cover", cover_mass=0.9,
                                  cover_keys_kernel=1), {(page,)})
        # Pooled forward (over the default 7 tokens), token 27's score reaches page 2's first
        # tokens, so pages 1 and 2 come first; centred, page 3's 0.8 follows page 1.
        ahead = np.full_like(rows, 1e-3)
        ahead[:, 27], ahead[:, 52] = 1.0, 0.8
        for forward, pages in ((None, (1, 3)), (True, (1, 2))):
            self.assertEqual(kept(f"forward{forward}", ahead, 2, rule="cover", cover_mass=0.9,
                                  cover_question_forward=forward), {pages}, forward)
        # The sink page ranked among the question's pages (cover_rank_sinks): the sink token's 5
        # ranks page 0 first and its token 6 holds most of the mass past the sink tokens, so
        # page 0 alone is kept; otherwise the span starts at page 1 and page 2's 0.5 leads.
        sinky = np.full_like(rows, 1e-3)
        sinky[:, 0], sinky[:, 6], sinky[:, 40] = 5.0, 1.0, 0.5
        for rank_sinks, page in ((None, 2), (True, 0)):
            self.assertEqual(kept(f"sinks{rank_sinks}", sinky, 1, rule="cover",
                                  cover_question_forward=True, cover_rank_sinks=rank_sinks),
                             {(page,)}, rank_sinks)
        # The default with the question: its rows by the cover rule, pooled forward with the sink
        # pages ranked, decided by
        # default_policy(True); page 1 leads the order, so every layer keeps it (the tail page
        # unprotected). The policy for the keys alone pools over 3 tokens, which the cover rule
        # refuses by name.
        mean = np.zeros((GEOMETRY["query_heads"], 32), np.float32)
        covariance = np.tile(np.eye(32, dtype=np.float32), (GEOMETRY["query_heads"], 1, 1))
        default = [entrokv.default_statistic(GEOMETRY["query_heads"], 64, mean, covariance,
                                             question_rows=ahead, dtype="f16")
                   for _ in range(GEOMETRY["layers"])]
        self.assertEqual(default[0].keys_mix.rule, types.KEYS_MIX_RULE_COVER)
        self.assertTrue(default[0].keys_mix.cover_question_forward)
        self.assertTrue(default[0].keys_mix.cover_rank_sinks)
        self.assertEqual(entrokv.default_statistic(GEOMETRY["query_heads"], 64, mean, covariance,
                                                   dtype="f16").WhichOneof("source"), "keys")
        self.client.open_sequence("keys", "default", parent="s", prefix_pages=4)
        for decision in self.client.decide("keys", "default", default, fraction=0.5,
                                           protect_tail_page=False,
                                           **entrokv.default_policy(True)):
            for group in decision.groups:
                self.assertIn(1, list(group.kept_pages))
        self.client.open_sequence("keys", "default-pooled", parent="s", prefix_pages=4)
        with self.assertRaisesRegex(entrokv.EntrokvError, "keys_mix.rule: the cover rule"):
            self.client.decide("keys", "default-pooled", default, fraction=0.5,
                               **entrokv.default_policy(False))
        with self.assertRaisesRegex(ValueError, 'cover_question_forward: only with rule="cover"'):
            entrokv.mixed_statistic(rows, keydiff, cover_question_forward=True)
        with self.assertRaisesRegex(ValueError, 'cover_rank_sinks: only with rule="cover"'):
            entrokv.mixed_statistic(rows, keydiff, cover_rank_sinks=True)
        with self.assertRaisesRegex(ValueError, 'keys_weight: not with rule="cover"'):
            entrokv.mixed_statistic(rows, keydiff, rule="cover", keys_weight=0.5)
        with self.assertRaisesRegex(ValueError, 'cover_mass: only with rule="cover"'):
            entrokv.mixed_statistic(rows, keydiff, cover_mass=0.5)
        with self.assertRaisesRegex(ValueError, r"cover_mass: must be in \(0, 1\]"):
            entrokv.mixed_statistic(rows, keydiff, rule="cover", cover_mass=0.0)
        # The daemon refuses a policy that pools tokens again, by name.
        with self.assertRaisesRegex(entrokv.EntrokvError, "keys_mix.rule: the cover rule"):
            self.client.decide("keys", "covered1",
                               [entrokv.mixed_statistic(rows, keydiff, rule="cover")]
                               * GEOMETRY["layers"], pages=1, policy="mean",
                               neighbourhood_kernel=3)

    def test_statistic_kind_is_sent(self):
        stats = np.full((2, 3), 1 / 3, np.float32)
        self.assertEqual(entrokv.statistic_message(stats).kind,
                         entrokv.statistic_message(stats, kind="last_row").kind)
        accumulated = entrokv.statistic_message(stats, kind="accumulated")
        self.assertEqual(accumulated.kind, 3)  # STATISTIC_KIND_ACCUMULATED
        self.assertEqual(entrokv.statistic_message(stats, kind="window_mean").kind, 2)
        with self.assertRaisesRegex(ValueError, "kind: 'sums' is not one of"):
            entrokv.statistic_message(stats, kind="sums")
        self.register("kinds")
        self.client.open_sequence("kinds", "s", initial_tokens=64)
        decisions = list(self.client.decide_stream(
            "kinds", "s", [(l, s) for l, s in enumerate(layer_stats(4, 64))], pages=2,
            policy="h2o", kind="accumulated"))
        self.assertEqual([d.policy for d in decisions], ["h2o"] * 3)

    def test_errors_name_the_field_and_change_nothing(self):
        self.register("errors")
        self.client.open_sequence("errors", "s", initial_tokens=64)
        before = self.assert_pool_consistent("errors")
        stats = layer_stats(4, 64)
        cases = [
            (lambda: self.client.decide("errors", "nope", stats, pages=1),
             entrokv.NotFoundError),
            (lambda: self.client.decide("missing-model", "s", stats, pages=1),
             entrokv.NotFoundError),
            (lambda: self.client.decide("errors", "s", layer_stats(4, 65), pages=1),
             entrokv.FailedPreconditionError),
            (lambda: self.client.decide("errors", "s", stats, pages=0),
             entrokv.InvalidArgumentError),
            (lambda: self.client.decide("errors", "s", stats, pages=1, policy="lru"),
             entrokv.InvalidArgumentError),
            (lambda: self.client.decide("errors", "s", stats, pages=1, tau=-1.0),
             entrokv.InvalidArgumentError),
            (lambda: self.client.decide("errors", "s", stats, pages=1, neighbourhood_kernel=4),
             entrokv.InvalidArgumentError),
            (lambda: self.client.decide("errors", "s", -stats, pages=1),
             entrokv.InvalidArgumentError),
            (lambda: self.client.open_sequence("errors", "s"), entrokv.AlreadyExistsError),
            (lambda: self.register("errors"), entrokv.AlreadyExistsError),
            (lambda: self.client.append_tokens("errors", "s", 10**9),
             entrokv.ResourceExhaustedError),
        ]
        for call, error_type in cases:
            with self.assertRaises(error_type) as raised:
                call()
            # The base class and the string code still work for callers written against them.
            self.assertIsInstance(raised.exception, entrokv.EntrokvError)
            self.assertEqual(raised.exception.code, error_type.status_code.name)
            self.assertTrue(raised.exception.message)
        after = self.assert_pool_consistent("errors")
        self.assertEqual(after.used_frames, before.used_frames)
        self.assertEqual([s.length_tokens for s in self.client.list_sequences("errors")], [64])
        with self.assertRaises(ValueError):
            entrokv.client.statistic_message(np.zeros((2, 3), dtype=np.float64))

    def test_truncate_drops_the_speculative_tokens(self):
        self.register("spec")
        self.client.open_sequence("spec", "s", initial_tokens=40)  # 3 pages, the last partial
        before = self.assert_pool_consistent("spec")
        self.assertEqual(self.client.append_tokens("spec", "s", 30), 70)  # 5 pages
        self.assertEqual(self.client.truncate_sequence("spec", "s", 30),
                         (40, 2 * GEOMETRY["layers"] * GEOMETRY["kv_groups"]))
        self.assertEqual(self.assert_pool_consistent("spec").used_frames, before.used_frames)
        # More than the sequence holds: OUT_OF_RANGE naming the field, nothing changed.
        with self.assertRaisesRegex(entrokv.OutOfRangeError, "tokens"):
            self.client.truncate_sequence("spec", "s", 41)
        with self.assertRaisesRegex(entrokv.InvalidArgumentError, "tokens"):
            self.client.truncate_sequence("spec", "s", 0)
        self.assertEqual([s.length_tokens for s in self.client.list_sequences("spec")], [40])
        self.assertEqual(self.assert_pool_consistent("spec").used_frames, before.used_frames)

    def test_chunks_accumulate_into_the_running_sum(self):
        # Two chunks' column sums sent one at a time decide as their sum sent at once.
        self.register("chunks")
        first, second = layer_stats(5, 64), layer_stats(6, 96)
        whole = second.copy()
        whole[:, :, :64] += first
        self.client.open_sequence("chunks", "whole", initial_tokens=96)
        want = self.client.decide("chunks", "whole", whole, pages=3, policy="h2o",
                                  kind="accumulated")
        self.client.open_sequence("chunks", "chunked", initial_tokens=64)
        self.client.decide("chunks", "chunked", first, pages=4, policy="h2o",
                           kind="accumulated", accumulate=True)
        self.client.append_tokens("chunks", "chunked", 32)
        got = self.client.decide("chunks", "chunked", second, pages=3, policy="h2o",
                                 kind="accumulated", accumulate=True)
        for g, w in zip(got, want):
            for gg, wg in zip(g.groups, w.groups):
                np.testing.assert_array_equal(gg.kept_pages, wg.kept_pages)
            self.assertFalse(g.degraded)
        with self.assertRaisesRegex(ValueError, "accumulate"):
            self.client.decide("chunks", "chunked", second, pages=3, accumulate=True)

    def test_deadline_fields_reach_the_daemon_and_degraded_comes_back(self):
        # When a layer is degraded is the daemon's (tests/service/lifecycle_test.cc, with a
        # forced estimate); here: the fields are sent, and the flag is read.
        self.register("deadline")
        self.client.open_sequence("deadline", "s", initial_tokens=64)
        with self.assertRaisesRegex(entrokv.InvalidArgumentError, "answer_within_ms"):
            self.client.decide("deadline", "s", layer_stats(7, 64), pages=2,
                               degrade_on_deadline=True, answer_within_ms=-1)
        with self.assertRaisesRegex(entrokv.FailedPreconditionError, "cached"):
            self.client.decide("deadline", "s", layer_stats(7, 64), pages=2,
                               use_cached_weights=True)
        decisions = self.client.decide("deadline", "s", layer_stats(7, 64), pages=2,
                                       degrade_on_deadline=True, answer_within_ms=60000)
        self.assertEqual([d.degraded for d in decisions], [False] * GEOMETRY["layers"])
        message = pb.LayerDecision(layer=1, policy="streaming", degraded=True)
        self.assertTrue(entrokv.LayerDecision.from_message(message).degraded)

    def test_bad_arguments_raise_value_error_before_anything_is_sent(self):
        self.register("args")
        self.client.open_sequence("args", "s", initial_tokens=64)
        before = self.assert_pool_consistent("args")
        stats = layer_stats(6, 64)
        with self.assertRaisesRegex(ValueError, r"frame_layout: 'rows' is not one of group, layer"):
            self.client.register_model("args-layout", frame_layout="rows", **GEOMETRY)
        with self.assertRaisesRegex(ValueError, r"backend: 'tpu' is not one of cuda, host"):
            self.client.register_model("args-backend", backend="tpu", **GEOMETRY)
        self.assertNotIn("args-layout", [p.model_id for p in self.client.list_models()])
        with self.assertRaisesRegex(ValueError, "layers: 2 indices for 3 statistics"):
            self.client.decide("args", "s", stats, layers=[0, 1], pages=1)
        # A list is encoded whole before the stream opens: layer 2's float64 array stops it
        # before layers 0 and 1 are decided.
        items = [(0, stats[0]), (1, stats[1]), (2, stats[2].astype(np.float64))]
        with self.assertRaisesRegex(ValueError, "float64 is not float32 or float16"):
            list(self.client.decide_stream("args", "s", items, pages=1))
        with self.assertRaisesRegex(ValueError, "each item must be a .layer"):
            list(self.client.decide_stream("args", "s", [stats[0]], pages=1))
        after = self.assert_pool_consistent("args")
        self.assertEqual(after.used_frames, before.used_frames)
        self.assertEqual(after.pages_evicted_total, 0)

    def test_stream_reraises_what_a_lazy_generator_raises(self):
        """A generator is read as prefill runs: the layers before the bad one are decided, then
        the caller gets the original exception, not gRPC's UNKNOWN."""
        self.register("lazy")
        self.client.open_sequence("lazy", "s", initial_tokens=64)
        stats = layer_stats(7, 64)

        def prefill():
            yield 0, stats[0]
            yield 1, stats[1].astype(np.float64)

        decided = []
        with self.assertRaisesRegex(ValueError, "float64 is not float32 or float16"):
            for decision in self.client.decide_stream("lazy", "s", prefill(), pages=1):
                decided.append(decision.layer)
        self.assertEqual(decided, [0])

        class PrefillFailed(RuntimeError):
            pass

        def failing():
            yield 1, stats[1]
            raise PrefillFailed("out of memory in layer 2")

        with self.assertRaises(PrefillFailed):
            list(self.client.decide_stream("lazy", "s", failing(), pages=1))
        self.assert_pool_consistent("lazy")

    def test_daemon_decides_like_entrokv_select(self):
        """The same .npy statistic through the daemon and through the offline CLI."""
        self.register("select")
        stats = layer_stats(5, 777)
        self.client.open_sequence("select", "s", initial_tokens=777)
        through_daemon = self.client.decide("select", "s", stats, pages=7, tau=0.7, alpha=1.0,
                                            protect_tail_page=False)
        offline = self.select_offline(stats, "--pages", "7", "--tau", "0.7", "--alpha", "1")
        self.assertEqual(len(offline), len(through_daemon))
        for cli_layer, daemon_layer in zip(offline, through_daemon):
            for cli_group, daemon_group in zip(cli_layer["groups"], daemon_layer.groups):
                self.assertEqual(cli_group["kept_pages"], daemon_group.kept_pages.tolist())
                np.testing.assert_allclose(cli_group["weights"], daemon_group.weights, rtol=1e-8)
                self.assertAlmostEqual(cli_group["uor"], daemon_group.shadow_uor, places=8)

    def test_neighbourhood_pooling_through_the_daemon_is_the_clis(self):
        """neighbourhood_kernel and neighbourhood_pooling reach the scorer: the daemon keeps
        the pages entrokv select keeps with the same options, and other pages than without."""
        self.register("neighbourhood")
        stats = layer_stats(5, 777)
        kept = {}
        for kernel, pooling in ((1, "max"), (7, "max"), (7, "mean")):
            sequence = f"s{kernel}{pooling}"  # a decision evicts: each its own sequence
            self.client.open_sequence("neighbourhood", sequence, initial_tokens=777)
            decided = self.client.decide("neighbourhood", sequence, stats, pages=7,
                                         neighbourhood_kernel=kernel,
                                         neighbourhood_pooling=pooling)
            kept[kernel, pooling] = [group.kept_pages.tolist()
                                     for layer in decided for group in layer.groups]
            offline = [group["kept_pages"]
                       for layer in self.select_offline(
                           stats, "--pages", "7", "--protect-tail", "--neighbourhood-kernel",
                           str(kernel), "--neighbourhood", pooling)
                       for group in layer["groups"]]
            self.assertEqual(offline, kept[kernel, pooling], (kernel, pooling))
        self.assertNotEqual(kept[1, "max"], kept[7, "max"])
        self.assertNotEqual(kept[7, "max"], kept[7, "mean"])
        with self.assertRaisesRegex(ValueError, "neighbourhood_pooling"):
            self.client.decide("neighbourhood", "s1max", stats, pages=7,
                               neighbourhood_pooling="median")

    def test_group_floor_through_the_daemon_is_the_clis(self):
        """group_floor reaches the scorer: the daemon keeps the pages entrokv select keeps with
        the same floor, the groups' counts move, and every layer keeps 2 x 7 pages as with fixed
        quotas."""
        self.register("floors")
        stats = layer_stats(5, 777)
        kept = {}
        for floor in (1.0, 0.25):
            sequence = f"s{floor}"
            self.client.open_sequence("floors", sequence, initial_tokens=777)
            decided = self.client.decide("floors", sequence, stats, pages=7, group_floor=floor)
            kept[floor] = [group.kept_pages.tolist() for layer in decided for group in layer.groups]
            offline = [group["kept_pages"]
                       for layer in self.select_offline(stats, "--pages", "7", "--protect-tail",
                                                        "--group-floor", str(floor))
                       for group in layer["groups"]]
            self.assertEqual(offline, kept[floor], floor)
            self.assertEqual(sum(len(pages) for pages in kept[floor]), len(stats) * 2 * 7)
        self.assertNotEqual([len(pages) for pages in kept[0.25]], [7] * (len(stats) * 2))
        with self.assertRaisesRegex(entrokv.InvalidArgumentError, "policy.group_floor"):
            self.client.decide("floors", "s1.0", stats, pages=7, group_floor=0.5,
                               policy="head_independent")

    def test_layer_layout_keeps_exactly_the_planned_frames(self):
        # A page of the layer layout holds every KV group: layer scope (the default there)
        # keeps one page set per layer, so the pool ends at P = floor(0.2 * 800 * 3 / 16) = 30
        # frames; group scope keeps the union of the groups' sets and reports it.
        tokens = 800
        for scope, model_id in ((None, "layer-auto"), ("group", "layer-group")):
            self.client.register_model(model_id, capacity_bytes=4096 * FRAME_BYTES * 2,
                                       frame_layout="layer", **GEOMETRY)
            self.client.open_sequence(model_id, "s", tokens)
            stats = np.random.default_rng(3).random(
                (GEOMETRY["layers"], GEOMETRY["query_heads"], tokens), dtype=np.float32)
            decisions = self.client.decide(model_id, "s", stats, fraction=0.2, policy="mean",
                                           scope=scope)
            used = self.assert_pool_consistent(model_id).used_frames
            if scope is None:
                self.assertEqual(used, 30)
                for decision in decisions:
                    self.assertEqual(decision.scope, "layer")
                    self.assertEqual(decision.union_pages, decision.quota_pages)
                    self.assertGreaterEqual(decision.group_scope_union_pages,
                                            decision.union_pages)
                    for group in decision.groups:
                        np.testing.assert_array_equal(group.kept_pages,
                                                      decision.groups[0].kept_pages)
            else:
                self.assertEqual([d.scope for d in decisions], ["group"] * 3)
                self.assertEqual(used, sum(d.union_pages for d in decisions))
                self.assertGreater(used, 30)
        with self.assertRaisesRegex(ValueError, "scope"):
            self.client.decide("layer-auto", "s", stats, fraction=0.2, scope="head")

    def test_example_worker_loop_runs(self):
        result = subprocess.run(
            [sys.executable, os.path.join(os.environ["ENTROKV_EXAMPLES"], "worker_loop.py"),
             "--server", self.daemon.address, "--tokens", "512"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ))
        self.assertEqual(result.returncode, 0, result.stderr)
        # The steps of docs/integrating.md: chunked prefill decisions, decode-time decisions
        # on cached weights, speculative drafts rolled back, close.
        self.assertIn("prefill chunk 0-512: 4 layers kept [16] pages per group of 32, freed 128 "
                      "frames", result.stdout)
        self.assertRegex(result.stdout, r"decode step 8: 4 layers kept \[16\] pages per group "
                                        r"of 3\d, freed \d+ frames")
        self.assertRegex(result.stdout, r"decode step \d+: \d of 4 drafts accepted, truncated "
                                        r"to \d+ tokens")
        self.assertRegex(result.stdout, r"pool: 128 used \+ \d+ free = \d+ frames")
        self.assertIn("closed: 128 frames released; decisions gone without: 0", result.stdout)


if __name__ == "__main__":
    unittest.main()
