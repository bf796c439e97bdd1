"""task.download: auto fetches a missing public data set into the data root from its mirrors
(node/download.py), verifies it and reuses it after; a corrupted download is one clear line and
leaves nothing half-written; an offline machine gets one line naming the folder and the key. A
local HTTP server stands in for the mirrors (EMULATOR_DATA_MIRRORS), serving gzipped copies of the
test data."""
import gzip
import http.server
import os
import threading
from pathlib import Path

import pytest

from conftest import REPO, SHARED_DATA, needs_mnist, read_csv, run_cli

from node.data import DataError, load
from node.download import SOURCES, DownloadError, fetch

FILES = [f.local for f in SOURCES["mnist"].files]


@pytest.fixture(scope="module")
def gzipped():
    """The test data's MNIST files, gzipped as a mirror serves them (made once)."""
    raw = Path(os.environ.get("EMULATOR_DATA", SHARED_DATA)) / "MNIST" / "raw"
    if not all((raw / name).exists() for name in FILES):
        pytest.skip("MNIST raw files not found (set EMULATOR_DATA)")
    return {f"/mnist/{name}.gz": gzip.compress((raw / name).read_bytes(), compresslevel=1, mtime=0) for name in FILES}


class Mirror:
    """A local HTTP server with the given files; records what was asked."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.asked = dict(files), []
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                mirror.asked.append(self.path)
                body = mirror.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{{dataset}}/"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_auto_fetches_verifies_and_reuses(tmp_path, gzipped, monkeypatch):
    with Mirror(gzipped) as mirror:
        monkeypatch.setenv("EMULATOR_DATA_MIRRORS", mirror.url)
        train, test = load("mnist", tmp_path)  # the default: auto
        assert (len(train.y), len(test.y)) == (60000, 10000)
        raw = Path(os.environ["EMULATOR_DATA"]) / "MNIST" / "raw"
        for name in FILES:  # kept decompressed, byte for byte the test data
            assert (tmp_path / "MNIST" / "raw" / name).read_bytes() == (raw / name).read_bytes()
        assert sorted(mirror.asked) == sorted(gzipped)
        load("mnist", tmp_path)
        assert len(mirror.asked) == 4  # reused: nothing asked again
    assert not list(tmp_path.rglob("*.part"))


def test_a_second_mirror_serves_what_the_first_lacks(tmp_path, gzipped, monkeypatch):
    with Mirror({}) as empty, Mirror(gzipped) as full:
        monkeypatch.setenv("EMULATOR_DATA_MIRRORS", f"{empty.url},{full.url}")
        assert len(fetch("mnist", tmp_path, log=open(os.devnull, "w"))) == 4
        assert len(empty.asked) == 4 and len(full.asked) == 4


def test_a_corrupted_download_is_one_line_and_leaves_nothing(tmp_path, gzipped, monkeypatch):
    broken = dict(gzipped)
    name = "/mnist/train-labels-idx1-ubyte.gz"
    labels = bytearray(gzip.decompress(broken[name]))
    labels[100] ^= 1  # one label changed: a whole, well-formed gzip of the wrong content
    broken[name] = gzip.compress(bytes(labels))
    with Mirror(broken) as mirror:
        monkeypatch.setenv("EMULATOR_DATA_MIRRORS", mirror.url)
        with pytest.raises(DataError) as err:
            load("mnist", tmp_path)
    message = str(err.value)
    assert "\n" not in message and "checksum mismatch" in message and "train-labels-idx1-ubyte.gz" in message
    assert str(tmp_path / "MNIST" / "raw") in message
    folder = tmp_path / "MNIST" / "raw"
    assert not (folder / "train-labels-idx1-ubyte").exists()
    assert not list(tmp_path.rglob("*.part"))  # nothing half-written
    # a truncated one (the server promises more than it sends) is refused too
    with Mirror({**gzipped, name: gzipped[name]}) as mirror:
        mirror.files[name] = gzipped[name][:100]
        monkeypatch.setenv("EMULATOR_DATA_MIRRORS", mirror.url)
        with pytest.raises(DownloadError):
            fetch("mnist", tmp_path, log=open(os.devnull, "w"))
    assert not (folder / "train-labels-idx1-ubyte").exists() and not list(tmp_path.rglob("*.part"))


def test_offline_the_run_is_one_line_naming_the_folder_and_the_key(tmp_path):
    # tests/conftest.py points the mirrors at a port nothing listens on
    empty = tmp_path / "empty"
    res = run_cli("run", str(REPO / "scenarios" / "smoke.yaml"), "--set", f"task.data_root={empty}", "--out",
                  str(tmp_path / "out"), timeout=120)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "task.dataset: dataset 'mnist' is not under" in lines[0] and str(empty / "MNIST" / "raw") in lines[0]
    assert "could not be downloaded" in lines[0] and "Traceback" not in res.stderr
    assert not empty.exists()  # nothing arrived: not even the folder was made
    # task.download: false never tries
    res = run_cli("run", str(REPO / "scenarios" / "smoke.yaml"), "--set", f"task.data_root={empty}", "--set",
                  "task.download=false", "--out", str(tmp_path / "out2"), timeout=120)
    assert res.returncode == 2 and "dataset 'mnist' not found under" in res.stderr and "task.download: auto" in res.stderr


@needs_mnist
def test_a_first_run_on_an_empty_data_root_downloads_and_runs(tmp_path, gzipped, monkeypatch):
    """The README's first command on a machine without the data: it fetches, verifies and runs."""
    empty = tmp_path / "data"
    with Mirror(gzipped) as mirror:
        monkeypatch.setenv("EMULATOR_DATA_MIRRORS", mirror.url)
        monkeypatch.setenv("EMULATOR_DATA", str(empty))
        res = run_cli("run", str(REPO / "scenarios" / "smoke.yaml"), "--set", "rounds=1", "--out", str(tmp_path / "out"),
                      timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(mirror.asked) == sorted(gzipped)
    assert all((empty / "MNIST" / "raw" / name).exists() for name in FILES)
    assert "downloaded http://127.0.0.1" in res.stderr
    assert len(read_csv(tmp_path / "out" / "rounds.csv")) == 1
