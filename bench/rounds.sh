# Shared by the bench scripts that compare training variants (sourced, not run): alternating
# rounds of `l3d train`, each variant keeping its best round.
#
# bench_rounds TAG GROUP VARIANT...: runs $L3D train --config $tmp/VARIANT.json --metrics ...
# for each variant in turn, $REPS rounds (this 2-core VM drifts 10-15% from minute to minute),
# and fills best[VARIANT] (the median tokens/s of steps 3.. of rank 0's metrics, its best
# round), peak[VARIANT] (the largest mem_peak_bytes of that round) and comm[VARIANT] (the
# GROUP ("tp", "dp" or "pp") bytes counted in that round's last step). label[VARIANT] names it
# in the progress lines on stderr; TAG names the script in errors.
median() {
  sed -nE 's/.*"step": ([0-9]+),.*"tokens_per_s": ([0-9.eE+-]+),.*/\1 \2/p' "$1" |
    awk '$1 >= 3 { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
           printf "%.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
declare -A best peak comm
bench_rounds() {
  local tag=$1 group=$2 rep v m med
  shift 2
  for rep in $(seq 1 "$REPS"); do
    for v in "$@"; do
      m=$tmp/$v.$rep.jsonl
      if ! "$L3D" train --config "$tmp/$v.json" --metrics "$m" >"$tmp/run.log" 2>&1; then
        echo "$tag: $v round $rep failed:" >&2; tail -n 20 "$tmp/run.log" >&2; exit 1
      fi
      med=$(median "$m") || { echo "$tag: $v: no metrics" >&2; exit 1; }
      echo "$tag: ${label[$v]} round $rep: median $med tok/s" >&2
      if [ -z "${best[$v]:-}" ] || awk -v a="$med" -v b="${best[$v]}" 'BEGIN { exit !(a > b) }'; then
        best[$v]=$med
        peak[$v]=$(sed -nE 's/.*"mem_peak_bytes": ([0-9]+).*/\1/p' "$m" | sort -n | tail -n 1)
        comm[$v]=$(tail -n 1 "$m" | sed -nE "s/.*\"comm_bytes\": \{[^}]*\"$group\": ([0-9]+).*/\1/p")
      fi
    done
  done
}
