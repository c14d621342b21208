"""Batch transport benchmark (issue 9): fastload's cache transport against torch's
DataLoader, webdataset's WebLoader and the store's fetch-and-write bound, one run.

One data set for the whole run: ``--images`` COCO-sized JPEGs (640x480, ~155 KB,
``_epoch_common.make_image_folder``) converted by ``fastload.convert.folder`` into
``--shard-size`` shards on local disk. Every variant runs through a DataLoader with
``--workers`` workers and ``--batch-size``; one untimed warm-up epoch per variant,
then ``--repeats`` timed epochs interleaved round by round (rotating order), each a
fresh loader, so worker start-up is inside the epoch as in training. Sections
(``--only`` runs one):

``warm`` -- raw bytes, shards in a warm ``cache_dir``:
  ``torch_sharded`` (baseline a): ``torch.utils.data.DataLoader(ShardedDataset(...),
  shuffle=True)``; ``wds_local`` (baseline b): ``wds.WebLoader(wds.WebDataset(<the
  shard files>, shardshuffle=<shards>).shuffle(1000).batched(B), batch_size=None)``;
  ``fl_sharded`` / ``fl_stream``: ``fastload.DataLoader`` over ``ShardedDataset``
  (``shuffle=True``) / ``StreamingDataset(shuffle=True)`` with the default (cache)
  transport; ``fl_*_pickle`` the same with ``transport="pickle"`` (context).
``cold`` -- raw bytes from SeaweedFS on 127.0.0.1 (the same shard files uploaded):
  ``fl_sharded_cold`` / ``fl_stream_cold`` with an empty ``cache_dir`` every epoch;
  ``wds_http``: the WebLoader over presigned URLs (s3fs ``fs.url``; webdataset opens
  them with curl); ``bound``: ranged GETs of every shard's bytes (FetchConfig's part
  size, 16 in flight, raw aiobotocore client) ``pwrite``-n into files of a fresh
  directory on the cache's filesystem (no fsync, no checksum: an upper bound).
  Each timed cold epoch follows an untimed one of the same variant (``--no-rehearse``
  to drop it). These machines are VMs with free page reporting: free blocks of 2 MiB
  and up go back to the host within seconds, and the next touch of such a page costs
  ~3-10 us. Every cold epoch frees its predecessor's cache files, so whichever variant
  next allocated large page-cache folios wrote into such memory and spent 0.3-0.6 CPU
  s more on the same bytes (fastload's aligned 1 MiB writes in a third to a half of
  its epochs, worst with a full page cache; with 32 KiB writes fastload was never hit
  and the bound was). So before each timed epoch, untimed: the guest is made to
  report what earlier variants freed (``report_free_pages_now``), then the variant
  runs once; the timed epoch reuses exactly the memory that rehearsal freed, as
  back-to-back epochs of one job do. A pass can still land inside a timed epoch (it
  then took up to 2x the wall and CPU time, whichever the variant): such an epoch is
  set aside and the round's epoch of that variant run again, rehearsal included, at
  most ``--reported-reruns`` times (default 2; every variant alike; the set-aside
  rates are printed; ``--reported-reruns 0`` keeps every epoch).
``decode`` -- 224x224 uint8 images of the first ``--decode-images`` JPEGs (their own
  shards, so a decode epoch stays a few seconds on two cores): ``torch_pil``
  (baseline): torch's DataLoader over the JPEG files, per-sample PIL decode
  (``_epoch_common.plain_decode_tensor``);
  ``fl_default``: ``fastload.DataLoader(ShardedDataset(decode="tensor",
  size=(224, 224)))`` as a user gets it (decoding in the worker processes, batches
  stacked channels-last in shared memory by ``collate_decoded``, each worker's
  batch memory recycled); ``fl_fresh_batches``: the same with
  ``recycle_batches=False`` (a fresh shared-memory segment per batch, context);
  ``fl_stream_default``: the same with ``StreamingDataset``; ``fl_threads<N>``:
  ``transport="cache", decode_threads=N`` (N = the default thread count), decoding
  in the loader's threads: the other candidate for the default; with
  ``--decode-pil-resize`` also ``fl_pil_resize``: the default with Pillow's resize
  instead of torch's (``Decoder(resizer="pil")``, context). The PIL flavour that ran
  (Pillow or Pillow-SIMD) and whose resize fastload used are printed and in the JSON.
``rss`` -- peak RSS (``VmHWM``) of each worker when the data set grows 10x: random
  139 KB payloads written with ``fastload.ShardWriter`` (``--rss-samples`` and 10x
  that), warm ``cache_dir``, one raw epoch per size and variant in a fresh
  subprocess, workers' ``/proc/<pid>/status`` read after every batch.

Every epoch is checked: each sample's key delivered exactly once (``StreamingDataset``
may repeat up to ``batch x workers`` samples to fill its last batches), so no figure
can come from a loader that drops or repeats samples. Reported: samples/s (median,
[min, max]), samples per CPU second (this process + its reaped workers), the steady
rate (first batch to last, worker start-up excluded) and the ratios to the baselines
(wall, per-round paired, per CPU second); goal lines with met/missed.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_transport.py [--images 2000]
        [--repeats 3] [--workers 2] [--batch-size 64] [--shard-size 32MB]
        [--decode-images 500] [--decode-pil-resize] [--rss-samples 2000]
        [--only warm|cold|decode|rss] [--quick]
        [--workdir DIR] [--json FILE]

``--quick`` is a smoke run (smaller defaults: 200 images in 4 MB shards, 100 for
decode, 200 and 2,000 rss samples, 1 round; flags given explicitly win): it proves
the sections run end to end, its figures mean little.

Goal lines use the paired ratio; the steady and per-CPU-second ratios are printed
next to it because on a shared machine they move least.

The package's modules, one a section: :mod:`transport.data` (the data set every
section shares), :mod:`transport.epochs` (timing, checking and comparing variants),
:mod:`transport.warm`, :mod:`transport.cold`, :mod:`transport.decode`,
:mod:`transport.rss`, :mod:`transport.report` (the printed report) and
:mod:`transport.cli` (flags, the run, the JSON document).
"""
