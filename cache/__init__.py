"""mgjit.cache: the on-disk kernel store (with an optional Redis tier) and its command line.

The compiler core builds keys with `hash_parts` and calls `default_store().get/put`; see `store` (the disk
store), `records` (what an entry is), `safefs` and `root` (the rules the disk store keeps), `remote` (Redis).
Nothing here imports MLIR, torch or numpy, so a cache hit stays cheap.
"""

from .store import (
    CacheWarning,
    Entry,
    EntryInfo,
    Store,
    Wanted,
    default_store,
    hash_parts,
)

__all__ = ["CacheWarning", "Entry", "EntryInfo", "Store", "Wanted", "default_store", "hash_parts"]
