"""Public data sets fetched into the data root the first time a run needs them (`task.download:
auto`, the default), verified by checksum, written whole or not at all, and reused after.

- MNIST and Fashion-MNIST: the four gzipped IDX files from the mirrors torchvision uses, kept
  decompressed in torchvision's raw layout (`MNIST/raw/train-images-idx3-ubyte`, ...). Each is
  checked by the SHA-256 of its decompressed content (so a mirror that gzips differently serves the
  same data).
- CIFAR-10: the Python archive from its authors' page, checked by its MD5 (the one the authors and
  torchvision publish), unpacked into `cifar-10-batches-py`.
- LEAF's FEMNIST and Shakespeare have no stable pre-split download (LEAF builds them with its own
  scripts), so they are never fetched: run LEAF's preprocessing and point the data root at it.

`EMULATOR_DATA_MIRRORS` replaces every data set's mirrors by a comma-separated list of base URLs,
each with `{dataset}` for the data set's name (a local cache, or the tests' HTTP server). A file
is downloaded to the system's temporary folder, then written under the data root as `NAME.part`
and renamed once it is whole and verified; a failed or corrupted download leaves nothing behind
(not even the data set's folder when nothing arrived)."""
from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MIRRORS_VARIABLE = "EMULATOR_DATA_MIRRORS"
TIMEOUT_S = 30.0
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A data set could not be fetched; the message names the file, the mirrors and why."""


@dataclass(frozen=True)
class RemoteFile:
    remote: str  # its name on the mirrors
    local: str  # where it goes, relative to the data set's folder
    digest: str  # hex digest of what is kept (the decompressed file, or the archive)
    algorithm: str = "sha256"
    unpack: str = "gunzip"  # "gunzip": keep it decompressed; "untar": unpack the archive into the data root


@dataclass(frozen=True)
class Source:
    folder: str  # under the data root
    mirrors: tuple[str, ...]
    files: tuple[RemoteFile, ...]

    def missing(self, root: Path) -> list[RemoteFile]:
        return [f for f in self.files if not (root / self.folder / f.local).exists()]


def _idx(names_digests: dict[str, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(f"{name}.gz", name, digest) for name, digest in names_digests.items())


SOURCES = {
    "mnist": Source("MNIST/raw", ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"), _idx({
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    })),
    "fashion_mnist": Source("FashionMNIST/raw", ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",), _idx({
        "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    })),
    "cifar10": Source("cifar-10-batches-py", ("https://www.cs.toronto.edu/~kriz/",), (
        RemoteFile("cifar-10-python.tar.gz", "test_batch", "c58f30108f718f92721af3b95e74349a", "md5", "untar"),)),
}


def mirrors(name: str) -> tuple[str, ...]:
    """The data set's mirrors, or EMULATOR_DATA_MIRRORS's (with {dataset} filled in)."""
    override = os.environ.get(MIRRORS_VARIABLE, "").strip()
    if override:
        return tuple(m.strip().replace("{dataset}", name) for m in override.split(",") if m.strip())
    return SOURCES[name].mirrors


def fetch(name: str, root: Path, log=sys.stderr) -> list[Path]:
    """Fetch what the data set `name` lacks under `root`; the paths written. Raises DownloadError
    (nothing half-written is left) when no mirror gives a whole, verified file."""
    source = SOURCES[name]
    folder = root / source.folder
    written = []
    for item in source.missing(root):
        errors = []
        for base in mirrors(name):
            url = base.rstrip("/") + "/" + item.remote
            try:
                written.append(_fetch_one(url, item, folder, root, log))
                break
            except DownloadError as exc:
                errors.append(str(exc))
            except (urllib.error.URLError, OSError, EOFError, tarfile.TarError) as exc:
                errors.append(f"{url}: {getattr(exc, 'reason', None) or exc}")
        else:
            raise DownloadError(f"{item.remote}: {'; '.join(errors)}")
    return written


def _fetch_one(url: str, item: RemoteFile, folder: Path, root: Path, log) -> Path:
    # downloaded to the system's temporary folder: nothing appears under the data root (not even
    # a folder) before a whole file has arrived
    fd, name = tempfile.mkstemp(suffix=".part", prefix="fl-emulator-")
    os.close(fd)
    part = Path(name)
    try:
        _download(url, part, log)
        if item.unpack == "gunzip":
            folder.mkdir(parents=True, exist_ok=True)
            return _gunzip_verified(part, folder / item.local, item, url)
        return _untar_verified(part, root, folder, item, url)
    finally:
        part.unlink(missing_ok=True)


def _download(url: str, to: Path, log) -> None:
    """The file at `url` into `to`, with a progress line on a terminal (one line when done otherwise)."""
    live = hasattr(log, "isatty") and log.isatty()
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(to, "wb") as out:  # noqa: S310 (http(s) mirrors)
        total = int(response.headers.get("Content-Length") or 0)
        done = 0
        while chunk := response.read(CHUNK):
            out.write(chunk)
            done += len(chunk)
            if live:
                of = f" of {total / 1e6:.1f} MB ({100 * done // total} %)" if total else ""
                print(f"\rdownloading {url}: {done / 1e6:.1f} MB{of}", end="", file=log, flush=True)
        if total and done != total:
            raise DownloadError(f"{url}: the download ended after {done} of {total} bytes")
    print(("\r" if live else "") + f"downloaded {url} ({done / 1e6:.1f} MB)", file=log, flush=True)


def _gunzip_verified(part: Path, target: Path, item: RemoteFile, url: str) -> Path:
    tmp = target.with_name(target.name + ".part")
    try:
        digest = hashlib.new(item.algorithm)
        with gzip.open(part, "rb") as src, open(tmp, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != item.digest:
            raise DownloadError(f"{url}: checksum mismatch ({item.algorithm} of the content {digest.hexdigest()[:16]}..., "
                                f"expected {item.digest[:16]}...): a corrupted or different file")
        tmp.replace(target)
        return target
    finally:
        tmp.unlink(missing_ok=True)


def _untar_verified(part: Path, root: Path, folder: Path, item: RemoteFile, url: str) -> Path:
    digest = hashlib.new(item.algorithm)
    with open(part, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != item.digest:
        raise DownloadError(f"{url}: checksum mismatch ({item.algorithm} {digest.hexdigest()}, expected {item.digest})")
    staging = root / f".{folder.name}.part"
    shutil.rmtree(staging, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(part) as tar:
            tar.extractall(staging, filter="data")  # no paths outside the staging folder
        unpacked = staging / folder.name
        if not (unpacked / item.local).exists():
            raise DownloadError(f"{url}: the archive has no {folder.name}/{item.local}")
        shutil.rmtree(folder, ignore_errors=True)
        unpacked.replace(folder)
        return folder
    finally:
        shutil.rmtree(staging, ignore_errors=True)
