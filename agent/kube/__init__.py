"""The only package that talks to Kubernetes: raw JSON requests, server-side apply, LIST, discovery."""
