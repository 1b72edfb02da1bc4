"""How long a `cb-agent view` page takes to build and to open in headless Chromium, and its size.

Builds the page of RESULTS once (``cb-agent view``), then opens it ``--repeat`` times from disk in
a fresh headless Chromium page (Debian's ``chromium``, driven by Playwright through that binary)
and prints, unrounded, the milliseconds from the start of navigation until the page has drawn its
summary and episode list (the script's ``data-ready`` mark), and until the load event; then opens
one episode and unfolds its decisions, timing that too.

    python benchmarks/explorer_open.py results/table1_alfworld.results.jsonl.gz --repeat 5
    # the same games as if every scored decision carried its terms (records older than the terms)
    python benchmarks/explorer_open.py results/table1_alfworld.results.jsonl.gz --fill-terms

``--fill-terms`` gives every scored decision without terms made-up ones of its recorded candidate
count (seeded normal draws: prior = log-softmax of N(0, 2^2), concept term N(0, 1.5^2), log P the
log-softmax of their sum; 3 decimals, as recorded), so a committed table older than the terms
shows what the page weighs and how it opens with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def fill_terms(paths: list[str], folder: Path) -> list[str]:
    """The results files with made-up terms on every scored decision that has none (one plain
    ``.jsonl`` each in ``folder``)."""
    import numpy as np
    import orjson

    from agent_shell.agents.step import rounded
    from agent_shell.results import read_results

    def log_softmax(x):
        return x - np.log(np.exp(x - x.max()).sum()) - x.max()

    rng = np.random.default_rng(0)
    out = []
    for k, path in enumerate(paths):
        filled = folder / f"filled{k}.jsonl"
        with open(filled, "wb") as fh:
            for r in read_results(path):
                for t in r.get("trials", ()):
                    for d in t["log"]["decisions"]:
                        m = d.get("n_candidates") or 0
                        if m > 1 and "prior" not in d:
                            prior = log_softmax(rng.normal(0, 2, m))
                            d["prior"] = rounded(prior)
                            if r["agent"] != "prior-only":
                                concept = rng.normal(0, 1.5, m)
                                d["concept"] = rounded(concept)
                                prior = log_softmax(prior + concept)
                            d["log_p"] = rounded(prior)
                fh.write(orjson.dumps(r) + b"\n")
        out.append(str(filled))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results files (.jsonl or .jsonl.gz) and eval-decisions files")
    parser.add_argument("--repeat", type=int, default=5, help="page opens (default 5)")
    parser.add_argument("--out", default=None, help="where to keep the page (default: a temporary folder)")
    parser.add_argument("--fill-terms", action="store_true",
                        help="give scored decisions without terms made-up ones (see above)")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium"),
                        help="the Chromium binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    if not args.chromium:
        print("no chromium binary: apt-get install chromium", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    from agent_shell.view import read_inputs, render_page
    from cb_io.storage import write_bytes_atomic

    folder = Path(args.out).parent if args.out else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else folder / "page.html"
    sources = fill_terms(args.results, folder) if args.fill_terms else args.results
    t0 = time.perf_counter()
    try:  # what `cb-agent view` does, through the library
        inputs = read_inputs(sources)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_bytes_atomic(out, render_page(inputs, sources).encode())
    print(f"build_s {time.perf_counter() - t0!r}")
    print(f"bytes {out.stat().st_size}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        for i in range(args.repeat):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(out.as_uri())
            page.wait_for_selector("body[data-ready]")
            ready = float(page.get_attribute("body", "data-ready"))
            load = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
            # in the page itself (no driver round trips): open the first episode with scored
            # decisions, then unfold every one of them, each followed by a forced layout
            episode_ms = page.evaluate("""() => {
                const t0 = performance.now();
                (document.querySelector("tr.episode-row:not([data-scored='0'])")
                 || document.querySelector("tr.episode-row")).click();
                for (const b of document.querySelectorAll("#view button.unfold")) {
                    b.click(); document.body.offsetHeight; }
                return performance.now() - t0; }""")
            print(f"open {i}: ready_ms {ready!r} load_ms {load!r} episode_and_decisions_ms {episode_ms!r} "
                  f"({page.locator('table.cands').count()} decisions unfolded)")
            page.close()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
