"""The ledger's per-namespace counts (issue 19: `galahad stats` <= 1 s at any size).

Each count changes in the same locked section as committed bytes, so it stays equal to the
disk through puts, deletions, eviction, quarantine moves and trims, a writer that dies
mid-publication, and a recount; `galahad stats` reads them and no record directory (counted
here by wrapping os.scandir and os.listdir: a measurement of what the command does, not a
stand-in for any part of it). An old ledger without counts is still read; a ledger whose
committed bytes were rewritten to a plausible but false figure cannot make a put over-evict.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from support.store_helpers import count_directory_entries

from hicache_galahad.ops import cli
from hicache_galahad.ops import reports as ops
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import disk_count, ledger_repair
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.store.journal import Journal, JournalItem
from hicache_galahad.store.layout import QUARANTINE_DIRNAME
from hicache_galahad.store.ledger_state import HEAD, MAGIC, NS_ENTRY, NS_HEAD, LedgerState

ALICE = Namespace("alice", "model", "kv", {"parallel": {"tp_rank": 3, "tp_size": 8}})
BOB = Namespace("bob", "model", "kv", {"parallel": {"tp_rank": None, "tp_size": 2}})
PAGE = 1000


def key(index: int) -> str:
    return f"{index:064x}"


def disk_counts(root) -> dict:
    """(records, bytes) of each namespace directory and of the quarantine, counted here."""
    found = {}
    for directory in Path(root, "ns").iterdir():
        files = [p.lstat() for p in directory.glob("*.rec") if p.is_file()]
        if files:
            found[directory.name] = (len(files), sum(_accounted(i) for i in files))
    quarantined = [p.lstat() for p in Path(root, "quarantine").iterdir()]
    if quarantined:
        found[QUARANTINE_DIRNAME] = (len(quarantined), sum(_accounted(i) for i in quarantined))
    return found


def _accounted(info) -> int:
    return min(info.st_size, info.st_blocks * 512)


def kept_counts(store) -> dict:
    counts = store.accounting.ledger.namespace_counts()
    assert counts is not None, "the ledger's counts are not complete"
    return {name: (c.records, c.disk_bytes) for name, c in counts.items()}


def fill(store, namespace, count, start=0, size=PAGE):
    for first in range(start, start + count, 8):
        keys = [key(i) for i in range(first, min(first + 8, start + count))]
        datas = [random.Random(key).randbytes(size) for key in keys]  # incompressible
        assert all(store.put_many(namespace, keys, datas))


# ----------------------------------------------------------------------------- kept true


def test_counts_follow_puts_deletions_eviction_quarantine_and_trims(tmp_path, store_factory):
    root = str(tmp_path / "store")
    record = PAGE + 112 + 64
    store = store_factory(root, durability="none", max_bytes=30 * record)
    for namespace in (ALICE, BOB):
        store.register_namespace(namespace)
    fill(store, ALICE, 20)
    fill(store, BOB, 5)
    counts = store.accounting.ledger.namespace_counts()
    assert counts[ALICE.dirname].records == 20 and counts[BOB.dirname].records == 5
    assert counts[ALICE.dirname].logical_bytes == 20 * PAGE  # exact: from each header
    assert kept_counts(store) == disk_counts(root)
    fill(store, ALICE, 10, start=100)  # into a full budget: every put evicts
    assert store.stats().counter("evictions") >= 5
    assert store.delete(ALICE, key(100))
    store.quarantine(BOB, key(1))  # a move: the counts follow it into the quarantine
    assert kept_counts(store) == disk_counts(root)
    assert kept_counts(store)[QUARANTINE_DIRNAME] == (1, record)
    store.quarantine_box.trim(keep_files=0)
    assert kept_counts(store) == disk_counts(root)
    assert QUARANTINE_DIRNAME not in kept_counts(store)
    assert sum(b for _, b in kept_counts(store).values()) == store.accounting.ledger.committed()
    logical = store.accounting.ledger.namespace_counts()[ALICE.dirname].logical_bytes
    records = kept_counts(store)[ALICE.dirname][0]
    assert logical == records * PAGE  # the mean share taken by each deletion: exact here


def test_a_put_counts_its_logical_bytes_without_reading_a_header(
    tmp_path, monkeypatch, store_factory
):
    """The writer hands the ledger each record's page bytes (JournalItem.logical_bytes), so
    no header is read back: exact and free."""
    root = str(tmp_path / "store")
    store = store_factory(root, durability="none")
    store.register_namespace(ALICE)
    reads = []
    monkeypatch.setattr(store.accounting.ledger, "_logical_of", lambda *a: reads.append(a))
    fill(store, ALICE, 24)
    assert store.accounting.ledger.namespace_counts()[ALICE.dirname].logical_bytes == 24 * PAGE
    assert reads == []


def test_a_writer_killed_between_link_and_ledger_write_is_counted_by_the_next(
    store_factory, tmp_path
):
    """The journal recovers the counts as it recovers committed bytes: a dead writer's
    publication (a journal left in the ledger, records linked) is counted by whoever takes
    the lock next. Produced for real: the ledger written as the writer left it."""
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
        fill(store, ALICE, 4)
        store.accounting.ledger.namespace_counts()  # (its logical bytes folded in)
        path = Path(root, "ledger")
        ns_dir = Path(root, "ns", ALICE.dirname)
        names = sorted(p.name for p in ns_dir.glob("*.rec"))[:2]
        items = [
            JournalItem(n, (ns_dir / n).stat().st_ino, _accounted((ns_dir / n).stat()))
            for n in names
        ]
        # As if a writer "deadbeef..." had journaled these two and died before counting
        # them: take them out of the ledger's figures, and leave its journal.
        state = LedgerState.parse(path.read_bytes())
        for item in items:
            state.committed -= item.size_bytes
            state.count_removed(ALICE.dirname, 1, item.size_bytes)
        state.journal = Journal("0badc0de" + "12345678", ALICE.dirname, items, Journal.PUBLISH)
        path.write_bytes(state.pack())
        assert kept_counts(store) == disk_counts(root)  # recovered under the lock
        assert store.accounting.ledger.namespace_counts()[ALICE.dirname].logical_bytes == 4 * PAGE


# ----------------------------------------------------------------------------- file format


def _old_ledger(root, committed: int) -> None:
    """A ledger as written before the counts existed (GLEDGER2: head and entries only)."""
    Path(root, "ledger").write_bytes(HEAD.pack(MAGIC, committed, 0, 0))


def test_an_old_ledger_without_counts_is_read_and_a_rebuild_fills_them(
    store_factory, tmp_path, capsys
):
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
        fill(store, ALICE, 6)
        committed = store.accounting.ledger.committed()
    _old_ledger(root, committed)
    with store_factory(root, durability="none") as store:
        assert store.usage_bytes() == committed  # read as ever: no recount at open
        assert store.accounting.ledger.namespace_counts() is None
        fill(store, ALICE, 2, start=50)  # updates keep the counts unknown, never wrong
        assert store.accounting.ledger.namespace_counts() is None
        assert Path(root, "ledger").read_bytes()[-NS_HEAD.size :] == NS_HEAD.pack(b"GNS1", 0, 0)
        report = ops.stats_report(StoreAdmin(store))
        assert report["counts"] == "walk" and report["records"] == 8  # falls back, says so
    assert cli.main(["stats", "--root", root]) == 0
    assert "--recount" in capsys.readouterr().out
    assert cli.main(["stats", "--root", root, "--recount", "--json"]) == 0
    capsys.readouterr()
    with store_factory(root, read_only=True) as store:
        assert kept_counts(store) == disk_counts(root) and ops.stats_report(StoreAdmin(store))[
            "counts"
        ] == ("ledger")


@pytest.mark.parametrize(
    "tail",
    [
        NS_HEAD.pack(b"GNS1", 2, 1) + b"\0" * NS_ENTRY.size,  # a table shorter than its count
        NS_HEAD.pack(b"GNSX", 0, 1),  # not the table's magic
        NS_HEAD.pack(b"GNS1", 0, 2),  # a flag no version defines
        b"\0" * 5,  # bytes that are no table
    ],
)
def test_a_damaged_count_table_is_a_damaged_ledger_recounted(store_factory, tmp_path, tail):
    assert LedgerState.parse(HEAD.pack(MAGIC, 5, 0, 0) + tail) is None
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
        fill(store, ALICE, 3)
        Path(root, "ledger").write_bytes(HEAD.pack(MAGIC, 1 << 40, 0, 0) + tail)
        assert store.usage_bytes() == store.parts.checker.disk_bytes()  # recounted from disk
        assert kept_counts(store) == disk_counts(root)


def test_a_damaged_ledger_recounted_by_a_read_is_written_back(store_factory, tmp_path):
    """A read (a locked section that changes nothing) that finds the ledger damaged recounts
    it and writes the recount. Before, the damaged bytes stayed on disk: every read walked
    every record again, and a read-only reader (stats, verify) saw a ledger of 0 bytes."""
    root = str(tmp_path / "store")
    with store_factory(root, durability="none") as store:
        store.register_namespace(ALICE)
        fill(store, ALICE, 3)
        on_disk = store.parts.checker.disk_bytes()
        ledger = store.accounting.ledger
        recounts = []
        real_recount = ledger.recount
        ledger.recount = lambda: recounts.append(1) or real_recount()
        Path(root, "ledger").write_bytes(HEAD.pack(MAGIC, 1 << 40, 0, 0) + b"\0" * 5)
        assert store.usage_bytes() == store.usage_bytes() == on_disk
        assert len(recounts) == 1  # the second read found the recount on disk
        assert LedgerState.parse(Path(root, "ledger").read_bytes()).committed == on_disk
    with store_factory(root, read_only=True) as reader:
        assert reader.usage_bytes() == on_disk


def test_a_table_entry_is_the_directory_name_and_four_counts():
    state = LedgerState.parse(
        HEAD.pack(MAGIC, 300, 0, 0)
        + NS_HEAD.pack(b"GNS1", 1, 1)
        + NS_ENTRY.pack(bytes.fromhex("ab" * 16), 2, 300, 250, 7)
    )
    assert state.counted_bytes() == 300
    assert state.counts["ab" * 16].as_tuple() == (2, 300, 250, 7)
    assert state.pack() == (
        HEAD.pack(MAGIC, 300, 0, 0)
        + NS_HEAD.pack(b"GNS1", 1, 1)
        + struct.pack("<16sQQQQ", bytes.fromhex("ab" * 16), 2, 300, 250, 7)
    )


# ----------------------------------------------------------------------------- forged ledger


def test_a_plausible_forged_ledger_cannot_make_a_put_over_evict(
    store_factory, tmp_path, monkeypatch
):
    """Committed bytes rewritten to a false figure well below what the filesystem holds (so
    the filesystem bound does not catch it): before the fix, a put into a budget of 40
    records holding 20 evicted real records to pay for the 30 the ledger only claimed."""
    root = str(tmp_path / "store")
    record = PAGE + 112 + 64
    with store_factory(root, max_bytes=40 * record, durability="none") as store:
        store.register_namespace(ALICE)
        fill(store, ALICE, 20)
        path = Path(root, "ledger")
        data = bytearray(path.read_bytes())
        _, committed, *rest = HEAD.unpack_from(data, 0)
        HEAD.pack_into(data, 0, MAGIC, committed + 30 * record, *rest)
        path.write_bytes(bytes(data))
        monkeypatch.setattr(store.accounting.repair, "_last_rebuild_s", 1e18)  # no recount due yet
        assert not store.put(ALICE, key(999), b"x" * PAGE)  # refused ...
        assert len(list(Path(root, "ns", ALICE.dirname).glob("*.rec"))) == 20  # ... nothing lost
        assert store.stats().counter("budget_unreconciled") >= 1
        monkeypatch.setattr(ledger_repair, "LEDGER_REBUILD_INTERVAL_S", 0.0)
        monkeypatch.setattr(store.accounting.repair, "_last_rebuild_s", -1e18)
        assert store.put(ALICE, key(999), b"x" * PAGE)  # recounted: the truth, and room
        assert len(list(Path(root, "ns", ALICE.dirname).glob("*.rec"))) == 21
        assert store.usage_bytes() == store.parts.checker.disk_bytes()


# ----------------------------------------------------------------------------- no walk


def test_stats_reads_no_record_directory_at_20k_records(
    store_factory, tmp_path, monkeypatch, capsys
):
    root = str(tmp_path / "store")
    records = 20_000
    with store_factory(root, durability="none") as store:
        for namespace in (ALICE, BOB):
            store.register_namespace(namespace)
        for first in range(0, records, 1000):
            keys = [key(i) for i in range(first, first + 1000)]
            namespace = ALICE if first < records // 2 else BOB
            assert all(store.put_many(namespace, keys, [b"r" * 64] * len(keys)))
    counter = count_directory_entries(monkeypatch)
    assert cli.main(["stats", "--root", root, "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == "ledger" and report["records"] == records
    assert {ns["rank"] for ns in report["namespaces"]} == {"tp 3/8", "tp all/2"}
    assert counter[0] < 50, counter  # the namespaces, stats/ and procs/: never a record's
    counter[0] = 0
    with store_factory(root, read_only=True) as store:
        assert (
            ops.bytes_to_verify(StoreAdmin(store)) == report["disk_bytes"]
        )  # verify's progress bar
        assert counter[0] < 50, counter  # sized from the ledger: no walk before the walk
        counter[0] = 0
        check = StoreAdmin(store).check(threads=2)
        # verify lists each directory once (it listed it three times: temp files, records,
        # then every record again for the bytes on disk)
        assert records <= counter[0] < records * 1.1 + 50, counter
        assert check.scanned_records == records and check.ledger_drift_bytes == 0
        assert check.records_per_s > 0 and check.mb_per_s > 0
        counter[0] = 0
        exact = ops.stats_report(StoreAdmin(store), exact=True)
    assert counter[0] >= records  # (the counter does see a walk)
    assert exact["records"] == records and exact["disk_bytes"] == report["disk_bytes"]
    assert exact["logical_bytes"] == report["logical_bytes"] == records * 64


def test_format_doc_names_the_ledger_as_the_code_writes_it():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    section = doc[doc.index("## The ledger") : doc.index("## Validation rules")]
    for magic in (MAGIC, b"GLEDGER3", b"GNS1"):
        assert f"`{magic.decode()}`" in section
    assert NS_ENTRY.size == 16 + 4 * 8 and "16 bytes" in section and "u64 each" in section
    assert QUARANTINE_DIRNAME == "0" * 32 and "`000...0`" in section
    assert {
        kind.decode() for kind in (Journal.PUBLISH, Journal.DELETE, Journal.TRIM, Journal.MOVE)
    } == {
        "P",
        "D",
        "Q",
        "M",
    }
    assert all(f"`{kind}`" in section for kind in "PDQM")


def test_a_recount_reads_a_bounded_sample_of_headers(tmp_path, monkeypatch, store_factory):
    """A recount runs under the ledger's lock: a stat per record, but the headers of at most
    LOGICAL_SAMPLE_RECORDS per namespace (logical bytes of the rest at the sample's ratio)."""
    root = str(tmp_path / "store")
    store = store_factory(root, durability="none")
    store.register_namespace(ALICE)
    fill(store, ALICE, 40)
    monkeypatch.setattr(disk_count, "LOGICAL_SAMPLE_RECORDS", 8)
    reads = []
    real = disk_count.DiskCount.logical_of
    monkeypatch.setattr(
        disk_count.DiskCount, "logical_of", lambda *args: reads.append(args) or real(*args)
    )
    StoreAdmin(store).rebuild_ledger()
    assert len(reads) == 8
    assert kept_counts(store) == disk_counts(root)
    count = store.accounting.ledger.namespace_counts()[ALICE.dirname]
    assert count.logical_bytes == 40 * PAGE  # records of one size: the ratio is exact


def test_the_table_is_changed_in_place_and_bounded():
    """An update finds its one entry (the table is never decoded whole on a put); a table
    at MAX_NAMESPACES, or records in a directory that is no namespace's, make the counts
    unknown rather than wrong."""
    from hicache_galahad.store.ledger_state import MAX_NAMESPACES, NamespaceCount

    names = [f"{index:032x}" for index in range(1, MAX_NAMESPACES + 1)]
    state = LedgerState(len(names))
    state.set_counts({name: NamespaceCount(1, 1, 1, 1) for name in names})
    raw = state.pack()
    state = LedgerState.parse(raw)
    state.count_added(names[-1], 2, 20, 10, 5)
    assert state.pack()[: -NS_ENTRY.size] == raw[: -NS_ENTRY.size]  # one entry changed
    assert state.counts[names[-1]].as_tuple() == (3, 21, 11, 5)
    state.count_removed(names[0], 1, 1)  # its last record: the entry goes
    assert names[0] not in state.counts and state.counted_bytes() == len(names) - 1 + 20
    state.count_added(names[0], 1, 1, 1)
    state.count_added("f" * 32, 1, 1, 1)  # one namespace too many
    assert not state.counts_complete and state.counted_bytes() is None
    state = LedgerState.parse(raw)
    state.count_added("not-a-namespace", 1, 1, 1)
    assert not state.counts_complete
