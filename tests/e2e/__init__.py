"""End-to-end tests: the operator installed with its chart, the examples applied with
kubectl, on the local cluster (tests/node_agent) or the one of STRATEGYJOB_E2E_KUBECONFIG."""
