"""`galahad blaise add|ask`: the text memory from the command line.

    galahad blaise add --root DIR FILE...
    galahad blaise ask --root DIR "question" [--k N] [--server URL]

`add` stores each file as a document named by its path as given. `ask` prints the selected
section(s) with their source; with `--server` it sends the composed prompt (token ids, see
prompt.py) to an SGLang server's /generate and prints the answer. The tokenizer is loaded
from the server's tokenizer path (`/model_info`) unless `--tokenizer` names one; the page
size comes from `/server_info` unless `--page-size` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

from .memory import Blaise, Selection

DEFAULT_MAX_NEW_TOKENS = 256
HTTP_TIMEOUT_S = 600


def add_subcommands(subparsers) -> None:
    """Adds `add` and `ask` to an argparse subparsers object; `run(args)` executes them."""
    add = subparsers.add_parser("add", help="store files as documents")
    _common(add)
    add.add_argument("files", nargs="+", metavar="FILE")
    add.set_defaults(blaise_command="add")

    ask = subparsers.add_parser("ask", help="select the section a question needs")
    _common(ask)
    ask.add_argument("question")
    ask.add_argument("--k", type=int, default=1, help="sections to print (default 1)")
    ask.add_argument("--server", help="SGLang server URL: send the prompt, print the answer")
    ask.add_argument("--tokenizer", help="tokenizer path (default: the server's model path)")
    ask.add_argument("--page-size", type=int, help="default: the server's page size")
    ask.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    ask.set_defaults(blaise_command="ask")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", required=True, help="galahad root directory")
    parser.add_argument("--tenant", default="default")
    parser.add_argument("--encryption-key-file", help="32-byte master key: records encrypted")


def run(args: argparse.Namespace, out=None) -> int:
    """Runs the command parsed by `add_subcommands`; returns the exit status."""
    out = out or sys.stdout
    with Blaise(args.root, args.tenant, args.encryption_key_file) as memory:
        if args.blaise_command == "add":
            return _add(memory, args.files, out)
        return _ask(memory, args, out)


def _add(memory: Blaise, files: list[str], out) -> int:
    status = 0
    for path in files:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            sections = memory.add(path, data)
        except (OSError, ValueError) as error:
            print(f"{path}: not added: {error}", file=sys.stderr)
            status = 1
            continue
        print(f"{path}: {len(data)} bytes, {len(sections)} sections", file=out)
    return status


def _ask(memory: Blaise, args: argparse.Namespace, out) -> int:
    found = memory.select(args.question, args.k)
    for item in found.skipped:
        print(f"skipped a damaged {item.what} of {item.doc_id!r}", file=sys.stderr)
    if not found:
        print("no section matches the question", file=sys.stderr)
        return 1
    for selection in found:
        _print_selection(selection, out)
    if args.server:
        answer = _answer(memory, found[0], args)
        print(f"answer: {answer}", file=out)
    return 0


def _print_selection(selection: Selection, out) -> None:
    path = " > ".join(selection.headings) or "(top)"
    print(
        f"source: {selection.doc_id} bytes {selection.start}-{selection.end} "
        f"section {selection.number} ({path}) score {selection.score:.2f}",
        file=out,
    )
    print(selection.text.rstrip("\n"), file=out)
    print(file=out)


def _answer(memory: Blaise, selection: Selection, args: argparse.Namespace) -> str:
    server = args.server.rstrip("/")
    if args.tokenizer:
        tokenizer_path = args.tokenizer
    else:
        info = _get_json(server + "/model_info")
        tokenizer_path = info.get("tokenizer_path") or info["model_path"]
    page_size = args.page_size or int(_get_json(server + "/server_info").get("page_size") or 1)
    tokenizer = _load_tokenizer(tokenizer_path)
    prompt = memory.prompt(args.question, tokenizer, page_size=page_size, selection=selection)
    body = {
        "input_ids": prompt.input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": args.max_new_tokens},
    }
    return str(_post_json(server + "/generate", body).get("text", "")).strip()


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer  # only for --server

    return AutoTokenizer.from_pretrained(path)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return json.load(response)


def _post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        return json.load(response)


def main(argv: list[str] | None = None) -> int:
    """`python -m hicache_galahad.blaise.cli add|ask ...` (until wired into `galahad`)."""
    parser = argparse.ArgumentParser(prog="galahad blaise", description=__doc__.split("\n")[0])
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
