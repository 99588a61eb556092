"""The batched-vs-sequential benchmark behind ``trajectory-ensemble bench`` (``make bench``).

Modules, along the seams of one run:

- :mod:`.workload`: the pipelines, the observation, the upstream reference and the batched runner;
- :mod:`.runner`: warm-up, interleaved timed repetitions, parity, the result records;
- :mod:`.memory`: peak memory per case (a fresh subprocess per case on CPU, CUDA counters on GPU);
- :mod:`.report`, :mod:`.table`, :mod:`.plot`: the JSON, the markdown table and the PNG;
- :mod:`.cli`: the ``bench`` flags, and dispatch of ``--quality`` and ``--ros`` to the modules that own them.
"""
