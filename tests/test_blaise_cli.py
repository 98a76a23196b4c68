"""`galahad blaise add|ask` through the functions the `galahad` console script wires in."""

from __future__ import annotations

import argparse
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from hicache_galahad.blaise import Blaise
from hicache_galahad.blaise.cli import add_subcommands, run

GUIDE = """# Harbour guide

## Bridges

The Quorvane Bridge is 4,381 metres long. It crosses the estuary south of the old town.

## Markets

The fish market opens at five. Traders sell cod, herring and mussels from the northern banks.
"""


def galahad(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="galahad")
    commands = parser.add_subparsers(dest="command", required=True)
    blaise = commands.add_parser("blaise")
    add_subcommands(blaise.add_subparsers(dest="blaise", required=True))
    out = io.StringIO()
    status = run(parser.parse_args(argv), out=out)
    return status, out.getvalue()


def test_add_then_ask_prints_the_section_and_its_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "guide.md").write_text(GUIDE)
    (tmp_path / "notes.txt").write_text("Codling moths are trapped with pheromone lures.\n")
    status, out = galahad(["blaise", "add", "--root", "store", "guide.md", "notes.txt"])
    assert status == 0
    assert f"guide.md: {len(GUIDE.encode())} bytes," in out and "notes.txt:" in out
    status, out = galahad(["blaise", "ask", "--root", "store", "How long is the Quorvane Bridge?"])
    assert status == 0
    assert out.startswith("source: guide.md bytes ")
    assert "(Harbour guide > Bridges)" in out
    assert "The Quorvane Bridge is 4,381 metres long." in out
    assert "fish market" not in out
    with Blaise(str(tmp_path / "store")) as memory:  # the CLI wrote a normal Blaise root
        assert memory.read("guide.md") == GUIDE.encode()


def test_errors_give_a_non_zero_status(tmp_path, capsys):
    (tmp_path / "bad.bin").write_bytes(b"\xff\xfe")
    root = str(tmp_path / "store")
    status, _ = galahad(["blaise", "add", "--root", root, str(tmp_path / "missing.txt")])
    assert status == 1
    status, _ = galahad(["blaise", "add", "--root", root, str(tmp_path / "bad.bin")])
    assert status == 1 and "not added" in capsys.readouterr().err
    status, out = galahad(["blaise", "ask", "--root", root, "anything?"])
    assert status == 1 and out == ""


class FakeServer(BaseHTTPRequestHandler):
    """Answers /model_info, /server_info and /generate like an SGLang server would."""

    requests: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        body = {"/model_info": {"model_path": self.server.model_path, "tokenizer_path": None}}
        body["/server_info"] = {"page_size": 8}
        self._reply(body[self.path])

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeServer.requests.append(request)
        self._reply({"text": " 4,381 metres.", "meta_info": {}})

    def _reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, "[UNK]"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.save_pretrained(tmp_path / "model")
    server = HTTPServer(("127.0.0.1", 0), FakeServer)
    server.model_path = str(tmp_path / "model")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeServer.requests = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_ask_with_server_sends_token_ids_and_prints_the_answer(tmp_path, fake_server):
    (tmp_path / "guide.md").write_text(GUIDE)
    root = str(tmp_path / "store")
    assert galahad(["blaise", "add", "--root", root, str(tmp_path / "guide.md")])[0] == 0
    question = "How long is the Quorvane Bridge?"
    status, out = galahad(["blaise", "ask", "--root", root, question, "--server", fake_server])
    assert status == 0 and out.rstrip().endswith("answer: 4,381 metres.")
    (request,) = FakeServer.requests
    assert isinstance(request["input_ids"], list) and request["input_ids"]
    assert request["sampling_params"]["temperature"] == 0.0
