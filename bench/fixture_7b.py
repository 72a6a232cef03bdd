"""The Qwen2-7B-shaped Q4_K_M fixture (`harness.fixture_7b`), written once and cached.

python -m bench.fixture_7b [--cache DIR]   (prints the file's path)"""

from harness.fixture_7b import main

if __name__ == "__main__":
    main()
