"""Recording what a real GPU computes, and turning it into a profile.

Run on a machine with an NVIDIA GPU and torch (``cpemu record`` drives them all):

* :mod:`.truth_recorder` -- torch._scaled_mm outputs for the designed case suites;
  which malformed calls torch rejects;
* :mod:`.cublaslt_heuristic` -- cuBLASLt's algorithm choice, asked exactly as torch asks (the command
  line; its grids, queries, log parser and torch-log children are the ``cublaslt_*`` modules, and the
  cuBLASLt binding itself is :mod:`cpemu.cuda.cublaslt`);
* :mod:`.splitk_table` -- compact split-K tables over many shapes;
* :mod:`.splitk_rule` -- the profile's split-K laws checked on them, and the point table;
* :mod:`.splitk_measure` -- dense samples: where the answer changes, the laws far out;
* :mod:`.splitk_enum` -- the complete record of the shapes the laws leave open (resumable, parallel);
* :mod:`.splitk_query` -- one heuristic answer as a tuple, for the two above;
* :mod:`.fit` -- which schedule and epilogue candidates reproduce recorded outputs;
* :mod:`.import_truth` -- a committed truth folder with its manifest.

The emulator never imports anything here; only the ``cpemu record`` command does.
"""
