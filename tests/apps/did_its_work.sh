# Sourced by the end-to-end tests that compare cache modes. A cache that silently behaved like
# `off`, or trainers that exchanged nothing, would still train bit-identically: each compared run
# must also show that its mode did its work.
#
# did_its_work SUMMARY_JSON: prints why and returns 1 unless the run's cache served rows (hit
# rate > 0) unless it is `off`, filled rows unless it is `device`, and, with several trainers,
# exchanged the gradients of shared rows.
did_its_work() {
  python3 - "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
why = []
if s["cache"] != "off" and not s["hit_rate"] > 0:
    why.append("the cache served no row (hit rate 0)")
if s["cache"] != "device" and not s["fills"] > 0:
    why.append("no row was fetched into the cache (fills 0)")
if s["trainers"] > 1 and not s["exchanged_rows"] > 0:
    why.append("no shared row was exchanged between the %d trainers" % s["trainers"])
if why:
    print("%s (--cache %s): %s" % (sys.argv[1], s["cache"], "; ".join(why)))
    sys.exit(1)
PY
}
