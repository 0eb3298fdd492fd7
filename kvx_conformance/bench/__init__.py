"""Write/gather bandwidth benchmarks: presets (:mod:`.sweep`), buffers (:mod:`.prepare`),
timers (:mod:`.timing`), peers (:mod:`.peers`), runs (:mod:`.run`), the HTML report
(:mod:`.report`) and ``kvx-conform compare`` (:mod:`.compare`). docs/benchmarks.md
describes the method and results.json."""
