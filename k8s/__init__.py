"""Kubernetes manifests of Ferry: kustomize base, overlays and the topology generator."""
