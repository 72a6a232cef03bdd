"""The Qwen2-7B-shaped fixture (`harness.fixture_7b`) in one of llama.cpp's K-quant mixes
(Q4_K_M, the default, 4.7 GB; Q3_K_M, 3.8 GB; Q2_K, 3.0 GB), written once and cached.

python -m bench.fixture_7b [--mix Q4_K_M|Q3_K_M|Q2_K] [--cache DIR]   (prints the file's path)"""

from harness.fixture_7b import main

if __name__ == "__main__":
    main()
