"""Storage: RocksDB (the source of truth, its key schema and migrations), the
serialisable operations a change is made of, the consistency check, and the Markdown
export format.
"""
