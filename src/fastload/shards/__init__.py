"""Shards: WebDataset tar writing (:mod:`.writer`), the manifest (:mod:`.manifest`),
the C++-built index (:mod:`.index`), zero-copy local reading (:mod:`.reader`) and
checksums (:mod:`.checksum`)."""
