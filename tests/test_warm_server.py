"""`galahad warm`/`ready` against a server that misbehaves, and `ready`'s probe of whether the
server restores now: a local HTTP server (loopback only, threads, stopped at the end of each
test) answers like SGLang 0.5.23's /server_info, /model_info, /tokenize and /generate, or,
where a test says so, trickles, never ends, or answers something malformed (issue 32 item 5);
a server whose extra config this machine cannot read (item 9); a server that reuses nothing of
what the store holds (issue 31). The store and the command are real; the server is the fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hicache_galahad.errors import ServerError
from hicache_galahad.ops import cli
from hicache_galahad.record.namespace import Namespace
from hicache_galahad.store import RecordStore
from hicache_galahad.store.admin import StoreAdmin
from hicache_galahad.warming.http import HttpServer
from hicache_galahad.warming.keys import page_keys
from hicache_galahad.warming.profile import ServerProfile
from hicache_galahad.warming.targets import HttpTarget

MODEL = "/models/tiny"
FINGERPRINT = "fp-tiny"
PAGE_SIZE = 4
THRESHOLD = 8  # the server's prefetch_threshold
PROBE_TOKENS = 12  # at least SGLang's load-back threshold (10 tokens), in whole pages
DTYPES = {"kv_cache_dtype": "auto", "mamba_ssm_dtype": "None", "dtype": "auto"}
TEXT = "the knight kept watch over the vessel all night"  # tokens: its bytes


class FakeServer:
    """SGLang's answers, or the fault a test sets in `routes[path]` (a function of the handler
    and the request's JSON body that writes the whole response itself)."""

    def __init__(self, root, extra_config=None):
        self.stop = threading.Event()
        self.requests: list[tuple[str, dict]] = []
        self.cached_details = None  # what /generate reports it reused (None: nothing)
        self.extra_config = extra_config or json.dumps(
            {"root": str(root), "model_fingerprint": FINGERPRINT, "prefetch_threshold": THRESHOLD}
        )
        self.routes = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append((self.path, body))
                route = fake.routes.get(self.path)
                if route is not None:
                    return route(self, body)
                return self._answer(fake.answer(self.path, body))

            do_GET = do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path, body):
        if path == "/server_info":
            return {
                "model_path": MODEL,
                "page_size": PAGE_SIZE,
                "tp_size": 1,
                "hicache_storage_backend_extra_config": self.extra_config,
                "hicache_write_policy": "write_through",
                **{name: (None if value == "None" else value) for name, value in DTYPES.items()},
            }
        if path == "/model_info":
            return {"model_path": MODEL, "served_model_name": MODEL, "tokenizer_path": MODEL}
        if path == "/tokenize":
            return {"tokens": list(body["prompt"].encode())}
        if path == "/generate":
            details = dict(self.cached_details or {})
            cached = sum(details.values())
            if details:  # as SGLang 0.5.23 reports it with a storage backend
                details["storage_backend"] = "dynamic"
            return {"meta_info": {"cached_tokens": cached, "cached_tokens_details": details}}
        return {}

    def generate_requests(self):
        return [body for path, body in self.requests if path == "/generate"]

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def store_root(tmp_path):
    """A store holding the server's namespace; `fill(text)` stores every page of a text."""
    root = tmp_path / "store"
    geometry = {
        "page_size": PAGE_SIZE,
        "model_name": MODEL,
        "parallel": {"tp_size": 1, "tp_rank": 0},
        "serving_dtypes": DTYPES,
    }
    with RecordStore(str(root)) as store:
        store.register_namespace(Namespace("default", FINGERPRINT, "kv", geometry))
    return root


def fill(root, text=TEXT):
    ids = list(text.encode())
    with RecordStore(str(root)) as store:
        ((_, namespace),) = StoreAdmin(store).namespaces_on_disk()
        for key in page_keys(ids, PAGE_SIZE):
            assert store.put(namespace, key, b"x" * 64)
    return ids


@pytest.fixture
def server(store_root):
    made = []

    def make(**options):
        made.append(FakeServer(store_root, **options))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def galahad(capsys, *args):
    status = cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def document(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text(TEXT)
    return str(path)


# ----------------------------------------------------------------------------- item 5


def _trickle(stop):
    def route(handler, body):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        handler.wfile.write(b'{"tokens": [')
        with contextlib.suppress(OSError):  # the reader hung up: done
            while not stop.is_set():
                handler.wfile.write(b"1,")
                handler.wfile.flush()
                time.sleep(0.2)

    return route


def _endless(handler, body):
    handler.send_response(200)
    handler.end_headers()
    chunk = b"[" * 65536
    with contextlib.suppress(OSError):
        for _ in range(1 << 16):  # 4 GiB at most, if nothing stopped the reader
            handler.wfile.write(chunk)


def test_a_trickling_answer_ends_at_the_calls_deadline(server, store_root):
    """Issue 32 item 5: urllib's timeout bounds each receive, so a /tokenize trickling a byte
    every 0.2 s never timed out (45 s and counting). The deadline bounds the whole call."""
    fake = server()
    fake.routes["/tokenize"] = _trickle(fake.stop)
    target = HttpTarget(fake.url, timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"/tokenize: no complete answer within 1.5 s"):
        target.tokenize(TEXT)
    assert time.monotonic() - started < 5


def test_a_trickling_header_ends_at_the_deadline_too(server):
    fake = server()

    def route(handler, body):
        handler.wfile.write(b"HTTP/1.0 200 OK\r\n")
        with contextlib.suppress(OSError):
            while not fake.stop.is_set():
                handler.wfile.write(b"X-Slow: 1\r\n")
                handler.wfile.flush()
                time.sleep(0.2)

    fake.routes["/server_info"] = route
    started = time.monotonic()
    with pytest.raises(ServerError, match="no complete answer within 1 s"):
        HttpTarget(fake.url, timeout_s=1).profile()
    assert time.monotonic() - started < 5


def test_an_endless_answer_is_capped(server):
    """An endless body grew to 1.4 GiB before a MemoryError; now it stops at the cap."""
    fake = server()
    fake.routes["/server_info"] = _endless
    target = HttpTarget(fake.url)
    target.server.max_answer_bytes = 1 << 20
    with pytest.raises(ServerError, match="larger than 1048576 bytes"):
        target.profile()


def test_the_cli_has_a_deadline_and_says_so_in_one_line(server, store_root, document, capsys):
    fake = server()
    fake.routes["/tokenize"] = _trickle(fake.stop)
    started = time.monotonic()
    status, _, err = galahad(capsys, "ready", "--server", fake.url, "--timeout", "1", document)
    assert status == 2 and time.monotonic() - started < 10
    assert err == f"galahad: {fake.url}/tokenize: no complete answer within 1 s\n"


@pytest.mark.parametrize(
    "answer,message",
    [
        ({"tokens": [1, 2, 1 << 70]}, "token id 1180591620717411303424: expected an integer"),
        ({"tokens": [1, -2]}, "token id -2: expected an integer"),
        ({"tokens": [1, 2.5]}, "token id 2.5: expected an integer"),
        ([1, 2, 3], "the answer is not a JSON object"),
        ({"tokens": "abc"}, "the answer has no list of tokens"),
    ],
    ids=["2^70", "negative", "float", "a list", "a string"],
)
def test_a_malformed_tokenize_answer_is_one_line_and_exit_2(
    server, store_root, document, capsys, answer, message
):
    """Ids of 2^70 and a /tokenize answering a list exited 4 ("unexpected", a bug)."""
    fake = server()
    fake.routes["/tokenize"] = lambda handler, body: handler._answer(answer)
    status, _, err = galahad(capsys, "ready", "--server", fake.url, document)
    assert status == 2, err
    assert err.startswith(f"galahad: {fake.url}/tokenize: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    "path,answer,message",
    [
        ("/server_info", [], "/server_info: the answer is not a JSON object"),
        ("/server_info", {"page_size": "four"}, "page_size='four': expected a positive"),
        ("/server_info", {"page_size": -4}, "page_size=-4: expected a positive integer"),
        ("/model_info", {"model_path": ["x"]}, "the server reports ['x'] where a name"),
    ],
)
def test_a_malformed_profile_is_one_line_and_exit_2(
    server, store_root, document, capsys, path, answer, message
):
    fake = server()
    fake.routes[path] = lambda handler, body: handler._answer(answer)
    status, _, err = galahad(capsys, "ready", "--server", fake.url, document)
    assert status == 2 and message in err and err.count("\n") == 1, err


def test_an_answer_that_is_not_json_is_one_line(server):
    fake = server()

    def route(handler, body):
        handler.send_response(200)
        handler.end_headers()
        handler.wfile.write(b"[" * 100_000)  # a RecursionError for json.loads

    fake.routes["/tokenize"] = route
    with pytest.raises(ServerError, match="/tokenize: the answer is not JSON"):
        HttpTarget(fake.url).tokenize(TEXT)


def test_an_extra_config_of_dev_zero_is_not_read_whole(tmp_path):
    """ "@/dev/zero" grew to 1.3 GiB; a FIFO would block. Only a regular file of at most
    1 MiB is read, and what could not be read is said, never taken for {}."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20) + "{}")
    for value, problem in (
        ("@/dev/zero", "/dev/zero is not a regular file"),
        (f"@{fifo}", f"{fifo} is not a regular file"),
        (f"@{big}", "is larger than 1048576 bytes"),
        ("@/nonexistent/galahad.json", "cannot read /nonexistent/galahad.json"),
        ("{not json", "the extra config is not JSON"),
    ):
        started = time.monotonic()
        profile = ServerProfile.from_args({"hicache_storage_backend_extra_config": value})
        assert problem in profile.extra_config_problem and time.monotonic() - started < 2
        assert profile.root is None and profile.store_options == {}


def test_a_url_that_is_not_one_is_one_line():
    with pytest.raises(ServerError, match="is not a server URL"):
        HttpServer("localhost:30000")


# ----------------------------------------------------------------------------- item 9


def test_warm_pin_refuses_when_the_servers_pin_limit_cannot_be_read(
    server, store_root, document, capsys, caplog
):
    """Issue 32 item 9: with the server's extra config an @file this machine cannot read, warm
    --pin took {} and pinned without the server's max_pinned_bytes (128,160 B pinned against a
    live server's 85,440 B limit). Now it refuses in one line and pins nothing."""
    fill(store_root)
    fake = server(extra_config="@/etc/sglang/galahad-unreadable.json")
    status, _, err = galahad(
        capsys, "warm", "--server", fake.url, "--root", str(store_root), "--pin", document
    )
    assert status == 2, err
    assert "warm --pin must obey the server's pin limit" in err and err.count("\n") == 1
    assert "cannot read /etc/sglang/galahad-unreadable.json" in err
    with RecordStore(str(store_root), read_only=True) as store:
        assert not store.pinned_bytes_by_tenant()
    # explicitly: within the root's limit (the live store processes', else the last applied)
    status, out, err = galahad(capsys, "warm", "--server", fake.url, "--root", str(store_root),
                               "--pin", "--root-pin-limit", "--json", document)  # fmt: skip
    assert status == 0, err
    assert "pinning within the root's limit" in caplog.text  # said, never silent
    pinned = json.loads(out)["documents"][0]["pinned"]
    assert pinned["pinned_records"] == len(TEXT) // PAGE_SIZE
    # without --pin nothing needs the limit: warm checks and reports as before
    status, out, err = galahad(capsys, "warm", "--server", fake.url, "--root", str(store_root),
                               "--json", document)  # fmt: skip
    assert status == 0, err
    assert json.loads(out)["documents"][0]["complete"]


def test_warm_pin_obeys_a_readable_limit(server, store_root, document, capsys, tmp_path):
    fill(store_root)
    config = tmp_path / "extra.json"
    config.write_text(
        json.dumps({"root": str(store_root), "model_fingerprint": FINGERPRINT, "max_bytes": 1 << 20,
                    "max_pinned_bytes": 0})
    )  # fmt: skip
    fake = server(extra_config=f"@{config}")
    status, out, err = galahad(capsys, "warm", "--server", fake.url, "--pin", "--json", document)
    assert status == 0, err
    pinned = json.loads(out)["documents"][0]["pinned"]
    assert pinned["pinned_records"] == 0 and pinned["refused_keys"] == len(TEXT) // PAGE_SIZE


# ----------------------------------------------------------------------------- issue 31


def test_ready_probes_the_server_with_the_shortest_stored_prefix(
    server, store_root, document, capsys
):
    """Issue 31: `ready` sends one request of the first stored tokens SGLang would look up and
    load back (the prefetch threshold, and at least 10 tokens, in whole pages) and one more,
    one output token, and reports what the server took from storage."""
    ids = fill(store_root)
    fake = server()
    fake.cached_details = {"device": 0, "host": 0, "storage": PROBE_TOKENS}
    status, out, err = galahad(capsys, "ready", "--server", fake.url, "--json", document)
    assert status == 0, err
    data = json.loads(out)
    assert data["complete"] and data["server_probe"]["verdict"] == "restored"
    assert data["server_probe"]["storage_tokens"] == PROBE_TOKENS
    (request,) = fake.generate_requests()
    assert request["input_ids"] == ids[: PROBE_TOKENS + 1]
    assert request["sampling_params"]["max_new_tokens"] == 1
    status, out, _ = galahad(capsys, "ready", "--server", fake.url, document)
    assert status == 0 and "server: restores now: the probe" in out


def test_ready_says_when_the_server_does_not_restore_what_the_store_holds(
    server, store_root, document, capsys
):
    """The records are all there, but the server's storage lookup timed out (a first start
    building SGLang's key-hash extension): exit 3 and its own line, not 'not fully stored'."""
    fill(store_root)
    fake = server()
    fake.cached_details = None  # recomputed: nothing reused
    status, out, err = galahad(capsys, "ready", "--server", fake.url, document)
    assert status == 3, out + err
    assert "not fully stored" not in out
    assert "server: does NOT restore now" in out and "storage lookup failed or timed out" in out
    status, out, _ = galahad(capsys, "ready", "--server", fake.url, "--json", document)
    assert status == 3 and json.loads(out)["server_probe"]["verdict"] == "not_restored"
    assert json.loads(out)["complete"]  # the records are there


def test_ready_says_when_the_prefix_came_from_the_servers_memory(
    server, store_root, document, capsys
):
    fill(store_root)
    fake = server()
    fake.cached_details = {"device": PROBE_TOKENS, "host": 0}
    status, out, _ = galahad(capsys, "ready", "--server", fake.url, "--json", document)
    assert status == 0 and json.loads(out)["server_probe"]["verdict"] == "in_memory"


def test_missing_records_send_no_probe_and_no_probe_sends_none(
    server, store_root, document, capsys
):
    fake = server()
    status, out, _ = galahad(capsys, "ready", "--server", fake.url, "--json", document)
    assert status == 1 and json.loads(out)["server_probe"]["verdict"] == "skipped"
    assert not fake.generate_requests()
    fill(store_root)
    status, out, _ = galahad(capsys, "ready", "--server", fake.url, "--no-probe", "--json",
                             document)  # fmt: skip
    assert status == 0 and "server_probe" not in json.loads(out)
    assert not fake.generate_requests()
