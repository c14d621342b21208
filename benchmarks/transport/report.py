"""The printed report of a run: each section's table, ratios and facts, then the
goal lines (met/MISSED)."""

from __future__ import annotations

from typing import Any

from _epoch_common import print_table


def print_doc(doc: dict[str, Any]) -> None:
    """Print the run's JSON document ``doc`` as the human report on stdout."""
    print(
        f"{doc['images']} JPEGs 640x480 ~{doc['mean_jpeg_bytes'] / 1000:.0f} KB in "
        f"{doc['shards']} shards of {doc['shard_size']}; {doc['workers']} workers, batch "
        f"{doc['batch_size']}; median [min, max] of {doc['repeats']} interleaved epochs; "
        f"load avg {doc['environment']['loadavg'][0]:.1f}"
    )
    for name, sec in doc["sections"].items():
        images = f", {sec['images']} images" if "images" in sec else ""
        print(f"\n== {name} ({sec['section_s']} s{images})")
        if "results" in sec:
            print_table(sec["results"], sec["ratios"])
            for v, r in sec["results"].items():
                extra = f"steady {r['steady_per_s']:.0f}/s" if r["steady_per_s"] else ""
                if "remote_bytes" in r:
                    extra += f", fetched {r['remote_bytes']} B per epoch"
                if "transport" in r:
                    extra += f", transport {r['transport']}"
                print(f"  {v:<22} {extra}")
            for k, r in sec["ratios"].items():
                if r.get("steady"):
                    print(f"  steady ratio {k:<38} {r['steady']:.2f}x")
        if name == "cold":
            print(
                f"  dataset {sec['dataset_bytes']} B; bound {sec['bound_request']}; "
                f"fastload streams {sec.get('fastload_streams')}"
            )
            for v, x in sec.get("cpu_s_per_gb", {}).items():
                print(f"  {v:<22} {x:.2f} client CPU-s per GB of shards (process tree)")
            for v, r in sec["results"].items():
                if r.get("remote_bytes") and v != "bound":
                    got = max(r["remote_bytes"]) / sec["dataset_bytes"]
                    print(f"  {v:<22} fetched {got:.4f}x the shards' bytes per epoch")
            how = "after a rehearsal" if sec.get("rehearsed") else "no rehearsal"
            counts = {
                v: r["epochs_with_reporting"]
                for v, r in sec["results"].items()
                if "epochs_with_reporting" in r
            }
            if counts:
                print(
                    f"  free page reporting ({how}): timed epochs it ran inside "
                    + ", ".join(f"{v} {k}/{doc['repeats']}" for v, k in counts.items())
                )
                aside = {
                    v: r["set_aside_per_s"]
                    for v, r in sec["results"].items()
                    if "set_aside_per_s" in r
                }
                print(
                    f"  epochs set aside and run again because a pass ran inside them "
                    f"(at most {sec.get('reported_reruns')} per round): "
                    + ", ".join(
                        f"{v} {len(x)}" + (f" ({', '.join(f'{y:.0f}' for y in x)}/s)" if x else "")
                        for v, x in aside.items()
                    )
                )
        if name == "decode":
            ib = sec["image_backend"]
            print(
                f"  PIL: {ib['library']} {ib['version']} (libjpeg-turbo "
                f"{ib['libjpeg_turbo_version']}); fastload resizes with "
                f"{ib['fastload_resizer']} (torch {ib['torch']})"
            )
            b = sec["bound"]
            print(
                f"  bound: one thread {b['one_thread_per_s']:.0f} img/s "
                f"({b['one_thread_per_cpu_s']:.0f} per CPU s) x {b['cores']} cores = "
                f"{b['bound_per_s']:.0f} img/s (load average {b['load_average']})"
            )
            for v, row in b["variants"].items():
                steady = row["steady_of_bound"]
                print(
                    f"    {v:<20} {row['of_bound']:.2f}x of bound (paired; steady "
                    f"{'n/a' if steady is None else f'{steady:.2f}x'}), efficiency "
                    f"{row['efficiency']:.2f} (img per CPU s / one thread's)"
                )
            w = sec["winner"]
            print(
                f"  decode winner: {w['faster']} (threads/processes paired "
                f"{w['threads_over_processes_paired']:.2f}x, per CPU s "
                f"{w['threads_over_processes_cpu']:.2f}x; default threads "
                f"{sec['default_threads']})"
            )
        if name == "rss":
            for v, r in sec["runs"].items():
                small, large = r["small"], r["large"]
                print(
                    f"  {v:<18} worker peak RSS {small['worker_peak_max'] / 2**20:.1f} MiB "
                    f"-> {large['worker_peak_max'] / 2**20:.1f} MiB ({r['ratio']:.3f}x); "
                    f"main peak {small['main_peak'] / 2**20:.0f} -> "
                    f"{large['main_peak'] / 2**20:.0f} MiB (at the end: anon "
                    f"{large['main_end'].get('RssAnon', 0) / 2**20:.0f}, file "
                    f"{large['main_end'].get('RssFile', 0) / 2**20:.0f} MiB)"
                )
    print("\ngoals:")
    for name, sec in doc["sections"].items():
        for g in sec.get("goals", []):
            need = g["need"] if isinstance(g["need"], str) else f">= {g['need']}x"
            if "CPU-s/GB" in g["ratio"]:
                print(
                    f"  [{'met' if g['met'] else 'MISSED'}] {name}: {g['ratio']} {need}: "
                    f"{g['paired']:.2f}"
                )
                continue
            print(
                f"  [{'met' if g['met'] else 'MISSED'}] {name}: {g['ratio']} {need}: "
                f"paired {g['paired']:.2f}x (wall {g['wall']:.2f}x)"
            )
