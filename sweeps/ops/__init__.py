"""Operations around sweeps: what a machine or cluster can do (`doctor`), and cluster files checked
offline (`clustercheck`, `clustercheck_k8s`)."""
