"""The fault proxy (faultproxy.py) as an instrument: it relays HTTP/1.1 exactly (keep-alive, Content-Length and
chunked bodies both ways), and each fault does what it says: latency, resets mid-body (an RST, not a FIN),
stalls, outages (reset and refused), synthetic S3 errors that a real S3 client reads as such; seeded faults
repeat; counters add up; nothing is left running."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import socket
import threading
import time
from typing import Any, Iterator

import pytest
from faultproxy import FaultProxy

BIG = 300_000  # bytes of the large test body


def payload(n: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(n))


class Upstream(http.server.BaseHTTPRequestHandler):
    """GET /len/N (Content-Length), GET /chunked/N (chunked), POST /echo (either request framing; answers the
    length and md5 of the body it got), HEAD /len/N."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", self.path.rsplit("/", 1)[1])
        self.end_headers()

    def do_GET(self) -> None:
        kind, n = self.path.strip("/").split("/")
        data = payload(int(n))
        self.send_response(200)
        if kind == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 40_000):
                part = data[i:i + 40_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_POST(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        out = f"{len(body)} {hashlib.md5(body).hexdigest()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def upstream() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    t.join(5)


@pytest.fixture
def proxy(upstream: int) -> Iterator[FaultProxy]:
    p = FaultProxy(upstream, seed=1)
    with p:
        yield p
    assert not p.alive, "the proxy thread is still running"


def raw_get(port: int, path: str, timeout: float = 5.0) -> tuple[bytes, BaseException | None]:
    """One GET on a raw socket: everything received, and the error that ended the read (None: a clean EOF)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            while chunk := s.recv(65536):
                got += chunk
        except OSError as e:
            return got, e
    return got, None


def test_relays_keep_alive_with_both_framings_both_ways(proxy: FaultProxy) -> None:
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    c.request("GET", f"/len/{BIG}")
    assert c.getresponse().read() == payload(BIG)
    c.request("GET", f"/chunked/{BIG}")
    r = c.getresponse()
    assert r.getheader("Transfer-Encoding") == "chunked" and r.read() == payload(BIG)
    body = payload(100_000)
    want = f"{len(body)} {hashlib.md5(body).hexdigest()}".encode()
    c.request("POST", "/echo", body=iter([body[:50_000], body[50_000:]]), encode_chunked=True)
    assert c.getresponse().read() == want
    c.request("POST", "/echo", body=body, headers={"Expect": "100-continue"})
    assert c.getresponse().read() == want
    c.request("HEAD", "/len/12345")
    r = c.getresponse()
    assert r.getheader("Content-Length") == "12345" and r.read() == b""
    c.request("GET", "/len/10")
    assert c.getresponse().read() == payload(10)
    c.close()
    # the proxy counts a response after its last byte is written, which can be after the client has read it
    deadline = time.monotonic() + 5
    while (s := proxy.stats())["responses"] < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s["connections"] == 1 and s["requests"] == s["responses"] == 6, s
    assert s["resets"] == 0 and s["bytes_down"] > 2 * BIG and s["bytes_up"] > 2 * len(body), s


def test_reset_cuts_the_body_and_sends_rst(proxy: FaultProxy) -> None:
    proxy.reset_probability = 1.0
    got, err = raw_get(proxy.port, f"/len/{BIG}")
    head_end = got.find(b"\r\n\r\n") + 4
    assert head_end > 4 and got.startswith(b"HTTP/1.1 200"), got[:100]
    assert 0 <= len(got) - head_end < BIG, f"{len(got) - head_end} body bytes: not cut"
    assert isinstance(err, ConnectionResetError), f"the connection ended with {err!r}, not an RST"
    got, err = raw_get(proxy.port, "/chunked/100")  # a short chunked body: cut anyway
    assert isinstance(err, ConnectionResetError) and b"0\r\nX-Trailer" not in got, (got, err)
    assert proxy.stats()["resets"] == 2


def test_latency_and_stall(proxy: FaultProxy) -> None:
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    proxy.latency = 0.2
    t0 = time.monotonic()
    c.request("GET", "/len/10")
    assert c.getresponse().read() == payload(10)
    assert 0.2 <= time.monotonic() - t0 < 1.5
    proxy.latency, proxy.stall_probability, proxy.stall_seconds = 0.0, 1.0, 0.6
    t0 = time.monotonic()
    c.request("GET", "/len/10")
    assert c.getresponse().read() == payload(10)
    assert 0.6 <= time.monotonic() - t0 < 2.0
    assert proxy.stats()["stalls"] == 1
    c.close()


@pytest.mark.parametrize("mode", ["reset", "refuse"])
def test_outage_ends_by_itself(proxy: FaultProxy, mode: str) -> None:
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    c.request("GET", "/len/10")
    assert c.getresponse().read() == payload(10)
    proxy.outage(1.0, mode)
    time.sleep(0.2)  # the live (idle, kept-alive) connection is reset too
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        c.request("GET", "/len/10")
        c.getresponse().read()
    c.close()
    expected = ConnectionResetError if mode == "reset" else ConnectionRefusedError
    got, err = None, None
    try:
        got, err = raw_get(proxy.port, "/len/10")
    except OSError as e:
        err = e
    assert isinstance(err, expected), (got, err)
    time.sleep(1.0)
    got, err = raw_get(proxy.port, "/len/10")
    assert err is None and got.endswith(payload(10)), (got, err)
    assert proxy.stats()["outage_resets"] >= 1


def test_synthetic_errors_for_matching_keys_while_the_rule_lasts(proxy: FaultProxy) -> None:
    rule = proxy.answer_error(r"^bucket/secret/.*\.parquet$", 0.8, 403)
    proxy.answer_error(r"gone\.parquet$", 0.8, 404)
    c = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    c.request("GET", "/bucket/secret/a%20b.parquet?x=1")
    r = c.getresponse()
    body = r.read()
    assert r.status == 403 and b"<Code>AccessDenied</Code>" in body and b"<Key>secret/a b.parquet</Key>" in body
    c.request("HEAD", "/bucket/secret/x.parquet")
    r = c.getresponse()
    assert r.status == 403 and r.read() == b""
    c.request("GET", "/bucket/gone.parquet")
    r = c.getresponse()
    assert r.status == 404 and b"<Code>NoSuchKey</Code>" in r.read()
    c.request("GET", "/len/10")  # another key passes, on the same connection
    assert c.getresponse().read() == payload(10)
    time.sleep(0.9)
    c.request("HEAD", "/bucket/secret/12")  # the rule is over (and did not match this key anyway)
    assert c.getresponse().status == 200
    c.close()
    assert rule.hits == 2 and proxy.stats()["synthetic"] == 3


def test_seeded_faults_repeat(upstream: int) -> None:
    def pattern(seed: int) -> list[bool]:
        out = []
        with FaultProxy(upstream, seed=seed) as p:
            p.reset_probability = 0.5
            for _ in range(20):
                _, err = raw_get(p.port, "/len/5000")
                out.append(err is not None)
        return out

    a = pattern(7)
    assert a == pattern(7) and 3 <= sum(a) <= 17, a
    assert a != pattern(8)


@pytest.mark.e2e
def test_a_real_s3_client_reads_the_synthetic_errors(s3: Any, bucket: str) -> None:
    import s3fs

    fs = s3.fs()
    fs.pipe(f"{bucket}/faultproxy/ok.bin", b"x" * 1000)
    with FaultProxy(s3.port) as p:
        via = s3fs.S3FileSystem(key=s3.key, secret=s3.secret, client_kwargs={"endpoint_url": p.endpoint},
                                skip_instance_cache=True, use_listings_cache=False)
        assert via.cat_file(f"{bucket}/faultproxy/ok.bin") == b"x" * 1000
        p.answer_error(r"faultproxy/ok\.bin$", 5, 403)
        with pytest.raises(PermissionError):
            via.cat_file(f"{bucket}/faultproxy/ok.bin")
        p.clear_rules()
        p.answer_error(r"faultproxy/ok\.bin$", 5, 404)
        with pytest.raises(FileNotFoundError):
            via.info(f"{bucket}/faultproxy/ok.bin")
        assert p.stats()["synthetic"] >= 2
