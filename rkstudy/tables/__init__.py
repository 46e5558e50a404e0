"""The tables: results written and stamped, their index, checks and diffs, the reference
documents' claims, benchmarks and `make reproduce`."""
