"""The restore side of tests/test_hybrid_exactness.py, in a fresh process:
`python tests/hybrid_restore.py MANIFEST OUTPUT`.

For every case of the manifest (JSON written by the test's live side) the store is opened
through SGLang's factory again, the restorable boundary comes from the store's own answer over
the strict prefix SGLang queries, KV and state are read into scribbled host slots and rebuilt
into a fresh cache, and [B, N) plus decode run; the logits go to OUTPUT (torch.save). A script
only: the models and pools are tests/hybrid_models.py.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from support import hybrid_models as hm
from support.checkpoints import CheckpointGrid, restorable_boundary
from support.records import page_keys


def _check_all(results: dict, expected: dict) -> None:
    for pool, count in expected.items():
        assert results.get(pool) == [True] * count, (pool, results)


def restore_case(model, layout, backend, kv, mamba, case: dict) -> dict:
    """The fresh-process side of one case: boundary from the store, restore, compute, decode."""
    page, interval = case["page_size"], case["interval"]
    tokens, num_tokens = case["tokens"], len(case["tokens"])
    keys = page_keys(tokens, page)
    query = keys[: (num_tokens - 1) // page]  # SGLang's strict prefix: the N - 1 cap, paged
    answer = hm.exists(backend, query, layout.has_recurrent_state)
    restorable = list(answer.restorable_prefix_pages)
    grid = CheckpointGrid(page_size_tokens=page, interval_tokens=interval)
    boundary = restorable_boundary(
        num_tokens, grid, max(restorable, default=0), {length - 1 for length in restorable}
    )
    result = {
        "boundary": boundary,
        "query_pages": len(query),
        "kv_hit_pages": answer.kv_hit_pages,
        "restorable_prefix_pages": restorable,
    }

    states, kv_pages = None, []
    if boundary:
        boundary_pages = boundary // page
        slots = kv.alloc(boundary)
        transfers = [hm.kv_transfer(query[:boundary_pages], slots)]
        slot = None
        if layout.has_recurrent_state:
            slot = int(mamba.alloc(1)[0])
            # _sync_trailing_keys: the state key is the last page of the actual hit.
            transfers.append(hm.state_transfer(query[boundary_pages - 1], slot))
        got = backend.batch_get_v2(transfers)
        _check_all(got, {"kv": boundary_pages} | ({"mamba": 1} if slot is not None else {}))
        kv_pages = hm.kv_from_pool(layout, kv, slots)
        states = hm.state_from_pool(layout, mamba, slot) if slot is not None else None
        kv.free(slots)
        if slot is not None:
            mamba.free(torch.tensor([slot]))
    cache = hm.build_cache(model, layout, kv_pages, boundary, states)
    logits = [hm.forward(model, tokens[boundary:], cache)]
    generated = []
    for _ in range(hm.NUM_DECODE):
        generated.append(int(logits[-1][-1].argmax()))
        logits.append(hm.forward(model, [generated[-1]], cache))
    result |= {"logits": logits, "generated": generated}

    if num_tokens % page == 0:
        result["negative"] = _buggy_full_prompt_restore(model, layout, backend, kv, mamba, case)
    return result


def _buggy_full_prompt_restore(model, layout, backend, kv, mamba, case: dict) -> dict:
    """What the buggy integration did: restore the full-prompt checkpoint (state at N, under the
    last page's key) while crediting N - 1 tokens, so token N - 1 is computed a second time on
    top of a state that already includes it. Decode is teacher-forced with the live tokens."""
    page, tokens = case["page_size"], case["tokens"]
    num_tokens = len(tokens)
    keys = page_keys(tokens, page)
    # The state at N is in the store: a query over all N / P pages (which SGLang never makes
    # for an N-token prompt) reaches it.
    full = hm.exists(backend, keys, layout.has_recurrent_state)
    slots = kv.alloc(num_tokens)
    transfers = [hm.kv_transfer(keys, slots)]
    slot = None
    if layout.has_recurrent_state:
        slot = int(mamba.alloc(1)[0])
        transfers.append(hm.state_transfer(keys[-1], slot))
    got = backend.batch_get_v2(transfers)
    _check_all(got, {"kv": len(keys)} | ({"mamba": 1} if slot is not None else {}))
    states = hm.state_from_pool(layout, mamba, slot) if slot is not None else None
    cache = hm.build_cache(
        model, layout, hm.kv_from_pool(layout, kv, slots), num_tokens - 1, states
    )
    kv.free(slots)
    if slot is not None:
        mamba.free(torch.tensor([slot]))
    logits = [hm.forward(model, tokens[num_tokens - 1 :], cache)]
    for token in case["live_generated"]:
        logits.append(hm.forward(model, [token], cache))
    return {
        "full_kv_hit_pages": full.kv_hit_pages,
        "full_restorable_prefix_pages": list(full.restorable_prefix_pages),
        "logits": logits,
    }


def restore_all(manifest: dict) -> dict:
    """Every case of the manifest, grouped by model and page size (one store instance each)."""
    results = {}
    for name, model_cases in manifest["models"].items():
        model = hm.build_model(name)
        assert hm.weights_digest(model) == model_cases["weights"], f"{name}: weights differ"
        layout = hm.probe_layout(model)
        for page_size in sorted({case["page_size"] for case in model_cases["cases"]}):
            pools = hm.pools_and_store(manifest["root"], name, layout, page_size, scribbled=True)
            with pools as (kv, mamba, backend):
                for case in model_cases["cases"]:
                    if case["page_size"] == page_size:
                        results[case["id"]] = restore_case(model, layout, backend, kv, mamba, case)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="JSON written by the test")
    parser.add_argument("output", help="torch.save file of the restored runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with open(args.manifest) as handle:
        manifest = json.load(handle)
    torch.save(restore_all(manifest), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
