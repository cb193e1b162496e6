"""The sandbox for model-written code: :mod:`groupwise.sandbox.process` runs a Python program in a separate, limited
process and reads back what it printed (the parent's side); :mod:`groupwise.sandbox.boot` is that process's first
code, which confines it (the child's side). docs/environments.md, "The Python sandbox", says what is isolated where."""
