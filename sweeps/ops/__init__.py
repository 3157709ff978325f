"""Operations around sweeps: what a machine or cluster can do, cluster files checked, the reference docs.

`doctor` measures what this machine, or each node of a Ray cluster, can do; `clustercheck` and
`clustercheck_k8s` check cluster files offline (Ray cluster-launcher YAMLs, Kubernetes and KubeRay
manifests), each problem a finding (`findings`); `docs` generates the documentation's reference pages from
the code.

May import every other package of `sweeps`."""
