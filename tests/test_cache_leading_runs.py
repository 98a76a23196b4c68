"""A full store keeps what SGLang can restore (issue 30's goals), on the issue's own workload.

60 documents of 32 small pages (16 tokens), keys chained as SGLang chains them, written in
batches of 8 pages; every third document is asked again 5 documents later (`batch_exists`,
then a read of its run); the byte budget holds a quarter of the pages written, every rank's
counted (so a rank's share is 15 documents whatever the ranks; bench/bench_cache.py, part
"runs" and "tp"). GalahadStorage comes out of SGLang's backend
factory over a real host pool; with several TP ranks each rank is its own process with its own
backend of its tp_rank, on one root and one budget, replaying the same script in lockstep with
the hit query MIN-reduced across ranks as SGLang's controller does.

Goals: pages in leading runs >= 0.95 of the pages the budget holds with one rank; restorable
pages (each document's run, min over ranks) >= 0.9 of one rank's share with 4 and 8 ranks.
"""

from __future__ import annotations

import pytest

from bench import bench_cache

DOCUMENTS, PAGES = 60, 32


def restorable_share(tmp_path, ranks: int) -> dict:
    setup = bench_cache.StoreSetup(bench_cache.record_bytes_of_small_pages(tmp_path))
    return bench_cache.leading_runs_real(
        bench_cache.GALAHAD, tmp_path / "root", DOCUMENTS, PAGES, ranks, setup
    )


def test_one_rank_keeps_leading_runs(tmp_path):
    figure = restorable_share(tmp_path, 1)
    assert figure["budget_pages"] == DOCUMENTS * PAGES // 4
    assert figure["ratio"] >= 0.95, figure


def test_four_ranks_keep_the_same_runs(tmp_path):
    figure = restorable_share(tmp_path, 4)
    assert figure["budget_pages"] == 4 * DOCUMENTS * PAGES // 4
    assert len(figure["own_run_ratios"]) == 4
    assert figure["ratio"] >= 0.9, figure


@pytest.mark.slow
def test_eight_ranks_keep_the_same_runs(tmp_path):
    figure = restorable_share(tmp_path, 8)
    assert len(figure["own_run_ratios"]) == 8
    assert figure["ratio"] >= 0.9, figure
