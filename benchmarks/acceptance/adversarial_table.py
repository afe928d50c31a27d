"""The README's adversarial table, from the CSVs the test run wrote (``GEMMRL_ADVERSARIAL_CSV=FILE pytest
tests/adversarial/test_adversarial.py``, once on the CPU tier and once on a GPU):

    python benchmarks/acceptance/adversarial_table.py "CPU (interpreter)=benchmarks/results/cpu/cpu_adversarial_2026-11-23.csv" \
        "H100=benchmarks/results/h100/h100_adversarial_2026-11-23.csv" --readme README.md

Prints the table; with ``--readme`` it replaces what stands between the README's ``<!-- adversarial:start -->`` and
``<!-- adversarial:end -->`` markers. Exits 1 if any attack in the files did not get its expected verdict.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.adversarial.catalogue import markdown_table, read_csv, summary  # noqa: E402

START, END = "<!-- adversarial:start -->", "<!-- adversarial:end -->"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="LABEL=CSV, one per tier (column order)")
    ap.add_argument("--readme", help="README to update between the markers")
    args = ap.parse_args(argv)
    files = {}
    for spec in args.files:
        label, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"{spec!r}: write LABEL=CSV, e.g. H100=benchmarks/results/h100/h100_adversarial_<date>.csv")
        files[label] = read_csv(path)
    notes = []
    for label, rows in files.items():
        s = summary(rows)
        meta = rows[0] if rows else {}
        notes.append(f"{label}: {s['as_expected']}/{s['attacks']} as expected, sandbox {', '.join(s['isolation'])}"
                     f" ({meta.get('gpu', '')}, git {meta.get('git_sha', '')}, {meta.get('timestamp', '')[:10]})")
    table = markdown_table(files) + "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print(table)
    if args.readme:
        path = Path(args.readme)
        text = path.read_text()
        if START not in text or END not in text:
            ap.error(f"{path} has no {START} ... {END} markers; add them where the table belongs")
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        path.write_text(f"{head}{START}\n{table}{END}{tail}")
    bad = [a for rows in files.values() for a in summary(rows)["unexpected"]]
    if bad:
        print(f"unexpected verdicts: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
