"""A corpus of hostile inputs, sent to a real server: each must get the right 4xx with a
``detail`` that names the problem, and the stored tables must be byte-for-byte unchanged
(checksum before/after). Names with HTML, SQL metacharacters and unicode are *valid*: they
must be stored and returned verbatim, and must not change anything else."""

from __future__ import annotations

import gzip
import json
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from reliability._reconcile import table_checksum

API = "/api/v1"
SQL_META = "x'; DROP TABLE sample; -- \" OR 1=1 /* %_ \\"
HTML_JS = '<img src=x onerror="window.__ns_xss=1"><script>window.__ns_xss=2</script>'
UNICODE = "训练 🚀 ñ \u202eevil\u202c \u200bzw Ωμέγα"


def good_columns(n: int, start: int = 10_000) -> dict[str, list[Any]]:
    seq = list(range(start, start + n))
    return {
        "seq": seq,
        "step": seq,
        "b_small": [8.0] * n,
        "b_big": [32.0] * n,
        "g_small_sq": [6.0] * n,
        "g_big_sq": [2.3] * n,
        "loss": [1.0] * n,
    }


def _samples(**changes: Any) -> bytes:
    cols: dict[str, Any] = good_columns(4)
    cols.update(changes)
    return orjson.dumps({"columns": cols})


def _run(**changes: Any) -> bytes:
    body: dict[str, Any] = {"project": "hostile", "task": "t", "name": "r", "batch_size": 32}
    body.update(changes)
    return json.dumps(body).encode()


def gzip_bomb(size: int) -> bytes:
    """``size`` bytes of spaces, gzip-compressed (about 1000:1), built without holding them."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    parts = [comp.compress(chunk) for _ in range(size >> 20)]
    return b"".join([*parts, comp.flush()])


def _nested(depth: int) -> bytes:
    return b'{"columns": ' + b"[" * depth + b"]" * depth + b"}"


def _nested_config(depth: int) -> bytes:
    inner = "1"
    for _ in range(depth):
        inner = '{"a":' + inner + "}"
    return ('{"project": "hostile", "task": "t", "config": ' + inner + "}").encode()


def _nested_payload(depth: int) -> bytes:
    inner = "{}"
    for _ in range(depth - 1):
        inner = '{"a":' + inner + "}"
    return ('{"events": [{"step": 1, "kind": "m", "payload": ' + inner + "}]}").encode()


def _events(*items: str) -> bytes:
    return ('{"events": [' + ",".join(items) + "]}").encode()


def _stored_samples() -> bytes:
    """The target run's first 10 samples, already stored before the corpus runs."""
    return orjson.dumps({"columns": good_columns(10, 0)})


def _members(body: bytes, n: int) -> bytes:
    """``body`` split into ``n`` gzip members (RFC 1952: one body, read to the last)."""
    size = -(-len(body) // n)
    return b"".join(gzip.compress(body[i : i + size]) for i in range(0, len(body), size))


#: The run-id rule's wording (``noisescope._wire.run_id_problem``).
RUN_ID_RULE = "1-64 characters from A-Z a-z 0-9 _ . -"
#: URL spellings of invalid run ids (a literal ``..`` is sent raw by ``run_raw_paths``).
HOSTILE_IDS = {
    "'.'": "%2e",
    "'..'": "%2e%2e",
    "'../x'": "..%2Fx",
    "'../../etc'": "..%2F..%2Fetc",
    "hidden '.x'": ".x",
    "65 chars": "a" * 65,
    "empty": "",
}
#: Every entry that takes a run id: (method, path after the id, body).
ID_ENTRIES: list[tuple[str, str, bytes | None]] = [
    ("PUT", "", b'{"project": "hostile", "task": "t"}'),
    ("PATCH", "", b'{"status": "finished"}'),
    ("GET", "/series", None),
    ("GET", "/events", None),
    ("POST", "/samples", b'{"columns": {}}'),
    ("POST", "/events", b'{"events": []}'),
    ("POST", "/heartbeat", b""),
]


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    #: ``{run}`` is replaced by the target run id, ``{new}`` by a fresh one.
    path: str
    body: bytes | None
    status: int
    needle: str
    headers: tuple[tuple[str, str], ...] = ()


GZ = (("Content-Encoding", "gzip"),)
S = "/runs/{run}/samples"
EV = "/runs/{run}/events"
R = "/runs/{new}"
CORPUS: list[Case] = [
    # wrong types
    Case("seq as string", "POST", S, _samples(seq=["0", "1", "2", "3"]), 422, "'seq'[0]"),
    Case("step as float", "POST", S, _samples(step=[0, 1.5, 2, 3]), 422, "'step'[1]"),
    Case("bool as step", "POST", S, _samples(step=[True, 1, 2, 3]), 422, "'step'[0]"),
    Case("norm as string", "POST", S, _samples(g_big_sq=["1", 1, 1, 1]), 422, "'g_big_sq'[0]"),
    Case("norm as object", "POST", S, _samples(g_small_sq=[{}, 1, 1, 1]), 422, "'g_small_sq'[0]"),
    Case("column as object", "POST", S, _samples(b_big={"0": 32}), 422, "'b_big' must be"),
    Case("body is a list", "POST", S, b"[1,2,3]", 422, "JSON object"),
    Case("body is a string", "POST", S, b'"columns"', 422, "JSON object"),
    Case("null required value", "POST", S, _samples(b_small=[None, 8, 8, 8]), 422, "'b_small'[0]"),
    Case("tags not a list", "PUT", R, _run(tags="a,b"), 422, "tags"),
    Case("batch_size as text", "PUT", R, _run(batch_size="big"), 422, "batch_size"),
    Case("status unknown", "PUT", R, _run(status="exploded"), 422, "status"),
    Case("units unknown", "PUT", R, _run(units="bytes"), 422, "units"),
    Case("extra field", "PUT", R, _run(colour="red"), 422, "colour"),
    Case("events not a list", "POST", "/runs/{run}/events", b'{"events": {}}', 422, "events"),
    # NaN / infinities
    Case("NaN literal", "POST", S, b'{"columns": {"seq": [NaN]}}', 400, "NaN"),
    Case("Infinity literal", "POST", S, b'{"columns": {"seq": [Infinity]}}', 400, "JSON"),
    Case("-Infinity literal", "POST", S, b'{"columns": {"loss": [-Infinity]}}', 400, "JSON"),
    Case("1e999 overflow", "POST", S, b'{"columns": {"g_big_sq": [1e999]}}', 400, "JSON"),
    Case(
        "NaN in run config", "PUT", R, b'{"project":"p","task":"t","config":{"x":NaN}}', 400, "NaN"
    ),
    Case("estimate overflows", "POST", S, _samples(g_big_sq=[1e308] * 4), 422, "too large"),
    # batch sizes
    Case("zero b_small", "POST", S, _samples(b_small=[0.0] * 4), 422, "0 < b_small < b_big"),
    Case("negative b_small", "POST", S, _samples(b_small=[-8.0] * 4), 422, "0 < b_small"),
    Case("negative b_big", "POST", S, _samples(b_big=[-32.0] * 4), 422, "0 < b_small"),
    Case("b_small == b_big", "POST", S, _samples(b_small=[32.0] * 4), 422, "must differ"),
    Case("b_small > b_big", "POST", S, _samples(b_small=[64.0] * 4), 422, "b_small < b_big"),
    Case("negative norm", "POST", S, _samples(g_small_sq=[-1.0] * 4), 422, "negative"),
    Case("zero run batch_size", "PUT", R, _run(batch_size=0), 422, "batch_size"),
    Case("negative run batch_size", "PUT", R, _run(batch_size=-64), 422, "batch_size"),
    Case("negative seq", "POST", S, _samples(seq=[-1, 1, 2, 3]), 422, "out of range"),
    Case("seq beyond int64", "POST", S, _samples(seq=[2**63, 1, 2, 3]), 422, "out of range"),
    Case("ragged columns", "POST", S, _samples(loss=[1.0]), 422, "same length"),
    Case("missing column", "POST", S, b'{"columns": {"seq": [1]}}', 422, "missing required"),
    # absurdly long names
    Case("run id 65 chars", "PUT", "/runs/" + "a" * 65, _run(), 422, "run id"),
    Case("run id with ../", "PUT", "/runs/..%2F..%2Fetc", _run(), 422, RUN_ID_RULE),
    Case("project 10k chars", "PUT", R, _run(project="p" * 10_000), 422, "project"),
    Case("name 201 chars", "PUT", R, _run(name="n" * 201), 422, "name"),
    Case("task 1M chars", "PUT", R, _run(task="t" * 1_000_000), 422, "task"),
    Case("101 tags", "PUT", R, _run(tags=[str(i) for i in range(101)]), 422, "tags"),
    Case("series 201 chars", "POST", S, _samples(series=["s" * 201] * 4), 422, "longer than"),
    Case(
        "event kind 65 chars",
        "POST",
        "/runs/{run}/events",
        b'{"events": [{"step": 1, "kind": "' + b"k" * 65 + b'"}]}',
        422,
        "kind",
    ),
    # unicode the server cannot store
    Case("NUL in run name", "PUT", R, _run(name="a\x00b"), 422, "name"),
    Case("NUL in series", "POST", S, _samples(series=["a\x00b"] * 4), 422, "series"),
    Case("lone surrogate", "PUT", R, b'{"project": "p", "task": "\\ud800"}', 400, "JSON"),
    Case("invalid utf-8", "PUT", R, b'{"project": "\xff\xfe", "task": "t"}', 400, "JSON"),
    # deeply nested JSON
    Case("nested 100k deep", "POST", S, _nested(100_000), 400, "JSON"),
    Case("config nested 5k deep", "PUT", R, _nested_config(5_000), 400, "JSON"),
    # oversized bodies and gzip bombs
    Case(
        "body over limit",
        "POST",
        S,
        b'{"columns": {"seq": [' + b"0," * 9_000_000 + b"0]}}",
        413,
        "limit",
    ),
    Case("corrupt gzip", "POST", S, b"\x1f\x8b\x08\x00garbage", 400, "gzip", GZ),
    Case("truncated gzip", "POST", S, gzip.compress(_samples())[:30], 400, "gzip", GZ),
    Case(
        "unknown encoding",
        "POST",
        S,
        _samples(),
        415,
        "Content-Encoding",
        (("Content-Encoding", "br"),),
    ),
    Case(
        "too many samples", "POST", S, orjson.dumps({"columns": good_columns(50_001)}), 413, "50000"
    ),
    Case("empty body", "POST", S, b"", 400, "empty"),
    # query API
    Case("max_points 0", "GET", "/runs/{run}/series?max_points=0", None, 422, "max_points"),
    Case(
        "max_points huge",
        "GET",
        "/runs/{run}/series?max_points=" + "9" * 30,
        None,
        422,
        "max_points",
    ),
    Case("bad x axis", "GET", "/runs/{run}/series?x=bogus", None, 422, "x"),
    Case("bad time filter", "GET", "/runs?started_after=yesterday", None, 422, "started_after"),
    Case("limit not a number", "GET", "/runs?limit=many", None, 422, "limit"),
    Case("NaN target", "GET", "/tasks/p/t/critical-batch?targets=nan", None, 422, "finite"),
    Case("bad loss source", "GET", "/tasks/p/t/critical-batch?loss=both", None, 422, "loss"),
    Case("unknown task", "GET", "/tasks/p/nope/critical-batch", None, 404, "does not exist"),
    Case(
        "too many runs",
        "GET",
        "/series?" + "&".join(f"runs=r{i}" for i in range(201)),
        None,
        422,
        "runs",
    ),
    Case("negative window", "GET", "/runs/{run}/series?window=-1", None, 422, "window"),
    Case("zero B_crit", "GET", "/parallelism?b_crit=0&per_device_batch=8", None, 422, "b_crit"),
    Case(
        "speed-up out of range",
        "GET",
        "/parallelism?b_crit=100&per_device_batch=8&min_speedup=2",
        None,
        422,
        "min_speedup",
    ),
    Case("unknown run", "GET", "/runs/nope/series", None, 404, "nope"),
    Case("search 60k chars", "GET", "/runs?search=" + "x" * 60_000, None, 422, "200 characters"),
    Case("search 201 chars", "GET", "/runs?search=" + "x" * 201, None, 422, "200 characters"),
    # strict types: nothing is coerced, as in samples
    Case("batch_size true", "PUT", R, _run(batch_size=True), 422, "batch_size"),
    Case('batch_size "64"', "PUT", R, _run(batch_size="64"), 422, "batch_size"),
    Case('PATCH batch_size "64"', "PATCH", "/runs/{run}", b'{"batch_size": "64"}', 422, "batch"),
    Case("PATCH status 1", "PATCH", "/runs/{run}", b'{"status": 1}', 422, "status"),
    Case('event step "1"', "POST", EV, _events('{"step": "1", "kind": "m"}'), 422, "step"),
    Case("event step true", "POST", EV, _events('{"step": true, "kind": "m"}'), 422, "step"),
    Case("event step 1.0", "POST", EV, _events('{"step": 1.0, "kind": "m"}'), 422, "step"),
    Case('event seq "3"', "POST", EV, _events('{"step": 1, "kind": "m", "seq": "3"}'), 422, "seq"),
    Case(
        'event time "1"', "POST", EV, _events('{"step": 1, "kind": "m", "time": "1"}'), 422, "time"
    ),
    # nesting the API could not read back (the encoder stops at 254 levels)
    Case("config nested 65 deep", "PUT", R, _nested_config(65), 422, "64 levels"),
    Case("config nested 300 deep", "PUT", R, _nested_config(300), 422, "64 levels"),
    Case("payload nested 300 deep", "POST", EV, _nested_payload(300), 422, "64 levels"),
    Case("config over 256 KiB", "PUT", R, _run(config={"x": "y" * 262_144}), 422, "262144 bytes"),
    # gzip variants
    Case(
        "gzip + trailing garbage",
        "POST",
        S,
        gzip.compress(_samples()) + b"junk",
        400,
        "trailing data",
        GZ,
    ),
    Case(
        "gzip + trailing zeros",
        "POST",
        S,
        gzip.compress(_samples()) + b"\0" * 8,
        400,
        "trailing data",
        GZ,
    ),
    Case(
        "deflate + trailing data",
        "POST",
        S,
        zlib.compress(_samples()) + b"xx",
        400,
        "trailing data",
        (("Content-Encoding", "deflate"),),
    ),
    Case(
        "multi-member gzip (re-sent seqs)", "POST", S, _members(_stored_samples(), 3), 200, "", GZ
    ),
    Case(
        "multi-member gzip, one bad",
        "POST",
        S,
        _members(_samples(step=[0, 1.5, 2, 3]), 2),
        422,
        "'step'[1]",
        GZ,
    ),
    # heartbeat
    Case("heartbeat unknown run", "POST", "/runs/nope/heartbeat", b"", 404, "does not exist"),
    Case("heartbeat with a body", "POST", "/runs/{run}/heartbeat", b"[1]", 422, "no body"),
    # hostile run ids, every spelling, at every entry
    *[
        Case(
            f"run id {label}: {method} {entry or '/'}",
            method,
            f"/runs/{spelling}{entry}",
            body,
            422,
            RUN_ID_RULE,
        )
        for label, spelling in HOSTILE_IDS.items()
        for method, entry, body in ID_ENTRIES
    ],
    Case("run id '..' in ?runs=", "GET", "/series?runs=ok&runs=%2e%2e", None, 422, RUN_ID_RULE),
    Case("run id '../x' in ?runs=", "GET", "/series?runs=..%2Fx", None, 422, RUN_ID_RULE),
    Case("empty run id in ?runs=", "GET", "/series?runs=", None, 422, RUN_ID_RULE),
]


@dataclass
class CaseResult:
    case: Case
    status: int
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == self.case.status and self.case.needle in self.detail


def build_corpus(bomb_bytes: int = 1 << 30) -> list[Case]:
    bomb = f"gzip bomb {bomb_bytes >> 20} MiB"
    return [*CORPUS, Case(bomb, "POST", S, gzip_bomb(bomb_bytes), 413, "decompressed", GZ)]


def run_corpus(
    base_url: str, engine: Any, corpus: list[Case] | None = None
) -> tuple[list[CaseResult], bool]:
    """Send every case against one target run; returns the results and whether the stored
    tables were unchanged by all of them."""
    corpus = build_corpus() if corpus is None else corpus
    target = uuid.uuid4().hex
    with httpx.Client(base_url=base_url + API, timeout=120) as client:
        r = client.put(f"/runs/{target}", content=_run())
        r.raise_for_status()
        client.post(f"/runs/{target}/samples", json={"columns": good_columns(10, 0)})
        before = table_checksum(engine)
        results = []
        for case in corpus:
            path = case.path.replace("{run}", target).replace("{new}", uuid.uuid4().hex)
            try:
                response = client.request(
                    case.method, path, content=case.body, headers=dict(case.headers)
                )
                try:
                    detail = str(response.json().get("detail", ""))
                except ValueError:
                    detail = response.text[:300]
                results.append(CaseResult(case, response.status_code, detail))
            except httpx.HTTPError as exc:
                results.append(CaseResult(case, 0, f"no answer: {exc!r}"))
        after = table_checksum(engine)
    return results, before == after


@dataclass
class RoundTrip:
    what: str
    sent: str
    got: str

    @property
    def ok(self) -> bool:
        return self.sent == self.got


def run_roundtrips(base_url: str) -> list[RoundTrip]:
    """Valid but nasty names (SQL metacharacters, HTML/JS, unicode) are stored verbatim and
    searching for them finds exactly that run, nothing else."""
    out: list[RoundTrip] = []
    with httpx.Client(base_url=base_url + API, timeout=60) as client:
        for label, value in (
            ("SQL metacharacters", SQL_META),
            ("HTML/JS", HTML_JS),
            ("unicode", UNICODE),
        ):
            rid = uuid.uuid4().hex
            value = f"{value} {rid[:8]}"  # unique, so "search finds only it" holds on reruns
            body = {
                "project": value[:200],
                "task": value[:200],
                "name": value[:200],
                "tags": [value[:200]],
                "batch_size": 32,
            }
            r = client.put(f"/runs/{rid}", json=body)
            if r.status_code != 201:
                out.append(RoundTrip(label, "201", f"{r.status_code} {r.text[:200]}"))
                continue
            cols = good_columns(3, 0)
            cols["series"] = [value[:200]] * 3
            posted = client.post(f"/runs/{rid}/samples", json={"columns": cols})
            got = client.get(f"/runs/{rid}").json()
            for field in ("project", "task", "name"):
                out.append(RoundTrip(f"{label}: {field}", value[:200], str(got.get(field))))
            out.append(RoundTrip(f"{label}: samples", "3", str(posted.json().get("inserted"))))
            found = client.get("/runs", params={"search": value[:200], "limit": 10000}).json()
            out.append(
                RoundTrip(
                    f"{label}: search finds only it",
                    rid,
                    ",".join(x.get("run_id", x.get("uid", "?")) for x in found),
                )
            )
            names = client.get(f"/runs/{rid}/series-names").json()
            out.append(
                RoundTrip(
                    f"{label}: series", value[:200], ",".join(str(n.get("name")) for n in names)
                )
            )
    return out
