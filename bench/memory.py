"""What a node's memory holds, on the 7B-shaped fixture: three capped node processes against
their spans' packed bytes, before and after a join moves every span (the code is
`harness.memory_lab`, shared with the opt-in test tests/test_memory_7b_e2e.py).

    python -m bench.memory [--tokens 8] [--no-join]
    python -m bench.memory --profile 0:9   (one process, RssAnon after each loading step)"""

from harness.memory_lab import main

if __name__ == "__main__":
    main()
