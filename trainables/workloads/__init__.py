"""Registered workloads, one module each, looked up by name (`trainables.registry`).

`base` is the structure every workload returns (`Workload`, `BuildContext`), registered or user-defined;
`declared` is what each registered workload declares without importing model code (its params and unit);
`gpt_lm`, `image_cnn` and `mlp_tabular` build them."""
