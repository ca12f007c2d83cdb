"""Object storage for diskless WAL files: one interface (put, conditional create, ranged get,
delete, list by prefix) with two implementations, a local directory (the embedded default) and S3
through `obstore` (async, so no executor for it).

Every failure of the store itself (unreachable, refused, I/O error) is an `ObjectStoreError`, so
callers map one exception to Kafka's retriable errors; a missing object is `ObjectNotFound`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig


class ObjectStoreError(Exception):
    """The store failed (down, refused, I/O error): retriable for the caller."""


class ObjectNotFound(ObjectStoreError):
    pass


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    last_modified_ms: int


class ObjectStore(Protocol):
    async def put(self, key: str, data: bytes) -> None:
        """Write `data` under `key`, replacing what was there."""

    async def create(self, key: str, data: bytes) -> bool:
        """Write `data` under `key` only if no object has that key; False if one had."""

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (fewer only if the object is shorter)."""

    async def get(self, key: str) -> bytes: ...

    async def delete(self, key: str) -> None:
        """Remove `key`; deleting a missing key is not an error (S3's rule)."""

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""

    async def close(self) -> None: ...


def new_object_key(prefix: str) -> str:
    """`<prefix>/<uuid>`, as Inkless names its WAL files."""
    return f"{prefix.strip('/')}/{uuid.uuid4()}" if prefix.strip("/") else str(uuid.uuid4())


# ---------------------------------------------------------------------------------------- local


class LocalObjectStore:
    """Objects as files under one directory; key `a/b` is file `<root>/a/b`. Writes go to a
    temporary file that is fsynced and then renamed (put) or hard-linked (create: link fails if
    the name exists, which makes the check and the write one atomic step). File work runs in the
    default executor, never on the event loop."""

    _TMP = ".tmp-"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)  # made by the first write (a missing root lists nothing)

    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        if not parts or any(p in (".", "..") or p.startswith(self._TMP) for p in parts):
            raise ObjectStoreError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, partial(fn, *args))
        except FileNotFoundError as e:
            raise ObjectNotFound(str(e)) from e
        except OSError as e:
            raise ObjectStoreError(f"local object store: {e}") from e

    def _write_tmp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{self._TMP}{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        os.replace(tmp, path)
        self._fsync_dir(path.parent)

    def _create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self._fsync_dir(path.parent)
        return True

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        with open(self._path(key), "rb") as f:
            return os.pread(f.fileno(), max(0, end - start), start)

    def _get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def _delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def _list(self, prefix: str) -> list[ObjectInfo]:
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(self._TMP):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        st = full.stat()
                    except FileNotFoundError:
                        continue  # deleted while we walked
                    out.append(ObjectInfo(key, st.st_size, int(st.st_mtime * 1000)))
        return sorted(out, key=lambda o: o.key)

    async def put(self, key: str, data: bytes) -> None:
        await self._run(self._put, key, data)

    async def create(self, key: str, data: bytes) -> bool:
        return await self._run(self._create, key, data)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await self._run(self._get_range, key, start, end)

    async def get(self, key: str) -> bytes:
        return await self._run(self._get, key)

    async def delete(self, key: str) -> None:
        await self._run(self._delete, key)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._run(self._list, prefix)

    async def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- S3


class S3ObjectStore:
    """S3 (or any S3-compatible server) through obstore. Credentials come from the usual AWS_*
    environment variables (obstore reads them); `endpoint` points at a non-AWS server."""

    def __init__(self, bucket: str, *, endpoint: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None) -> None:
        from obstore.store import S3Store

        kwargs: dict[str, Any] = {}
        if endpoint:
            kwargs["endpoint"] = endpoint
            kwargs["virtual_hosted_style_request"] = False
            if endpoint.startswith("http://"):
                kwargs["allow_http"] = True
        if region:
            kwargs["region"] = region
        if access_key_id:
            kwargs["access_key_id"] = access_key_id
            kwargs["secret_access_key"] = secret_access_key or ""
        # A store that is down must fail a produce within its timeout, not after obstore's
        # default 10 retries over 3 minutes: the producer retries anyway.
        client_options: ClientConfig = {"connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=30)}
        if kwargs.pop("allow_http", False):
            client_options["allow_http"] = True
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=10),
                 "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=2),
                             "base": 2}}
        try:
            self._store = S3Store(bucket, client_options=client_options, retry_config=retry, **kwargs)
        except Exception as e:  # obstore raises its own config errors
            raise ObjectStoreError(f"S3 store: {e}") from e

    @staticmethod
    def _error(e: Exception) -> ObjectStoreError:
        import obstore.exceptions as oe

        if isinstance(e, FileNotFoundError | oe.NotFoundError):
            return ObjectNotFound(str(e))
        return ObjectStoreError(f"S3 store: {type(e).__name__}: {e}")

    async def put(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await obstore.put_async(self._store, key, data, use_multipart=False)
        except Exception as e:
            raise self._error(e) from e

    async def create(self, key: str, data: bytes) -> bool:
        import obstore
        import obstore.exceptions as oe

        try:
            await obstore.put_async(self._store, key, data, mode="create", use_multipart=False)
        except (oe.AlreadyExistsError, FileExistsError, oe.PreconditionError):
            return False
        except Exception as e:
            raise self._error(e) from e
        return True

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        import obstore

        if end <= start:
            return b""
        try:
            return bytes(await obstore.get_range_async(self._store, key, start=start, end=end))
        except Exception as e:
            raise self._error(e) from e

    async def get(self, key: str) -> bytes:
        import obstore

        try:
            result = await obstore.get_async(self._store, key)
            return bytes(await result.bytes_async())
        except Exception as e:
            raise self._error(e) from e

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await obstore.delete_async(self._store, key)
        except Exception as e:
            err = self._error(e)
            if not isinstance(err, ObjectNotFound):
                raise err from e

    async def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        out = []
        try:
            async for chunk in obstore.list(self._store, prefix or None):
                for meta in chunk:
                    if meta["path"].startswith(prefix):
                        out.append(ObjectInfo(meta["path"], meta["size"],
                                              int(meta["last_modified"].timestamp() * 1000)))
        except Exception as e:
            raise self._error(e) from e
        return sorted(out, key=lambda o: o.key)

    async def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class StoreLocation:
    store: ObjectStore
    prefix: str  # keys are `<prefix>/<uuid>`


def open_object_store(url: str, *, endpoint: str | None = None, region: str | None = None) -> StoreLocation:
    """`file:///abs/dir` or `s3://bucket/prefix` (the broker config `diskless.storage.url`)."""
    u = urlparse(url)
    if u.scheme == "file":
        if not u.path.startswith("/"):
            raise ValueError(f"diskless.storage.url {url!r}: a file URL needs an absolute path")
        return StoreLocation(LocalObjectStore(u.path), "wal")
    if u.scheme == "s3":
        if not u.netloc:
            raise ValueError(f"diskless.storage.url {url!r}: no bucket")
        prefix = u.path.strip("/") or "wal"
        return StoreLocation(S3ObjectStore(u.netloc, endpoint=endpoint, region=region), prefix)
    raise ValueError(f"diskless.storage.url {url!r}: the scheme must be file or s3")
