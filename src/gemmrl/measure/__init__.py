"""Measuring candidates: the one unit that verifies and times a candidate beside the vendor paths (core), and what
is built on it: `gemmrl bench` (bench), one sandboxed evaluation (evaluate), untrusted sources through the sandbox
pool (sandboxed), the headroom probe (headroom) and ncu profiles (ncu)."""
