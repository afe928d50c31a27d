#!/usr/bin/env bash
# Leave at most 8 files in a GPU call's output folder (what the device returns): the results (CSVs, JSON files, the
# journey cache tarballs) stay as they are where there are 7 or fewer, else they go into results.tgz; everything
# else (summaries, logs, the vendor choices' tarballs, sub-folders) goes into extras.tgz.
#   bash benchmarks/acceptance/pack_out.sh "$GEMMRL_OUT"
set -uo pipefail
out=${1:?give the output folder}
cd "$out" || exit 1
shopt -s nullglob
keep=(*.csv *.csv.gz *.json journey_cache*.tgz)  # (a pattern: nothing where there is none)
rest=()
for f in * .[!.]*; do
  case " ${keep[*]} " in *" $f "*) ;; *) [ "$f" = extras.tgz ] || [ "$f" = results.tgz ] || rest+=("$f") ;; esac
done
if [ ${#rest[@]} -gt 0 ]; then
  tar czf extras.tgz --remove-files "${rest[@]}" || exit 1
fi
if [ ${#keep[@]} -gt 7 ]; then
  tar czf results.tgz --remove-files "${keep[@]}" || exit 1
fi
