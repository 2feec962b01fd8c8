"""A study on a Kubernetes cluster (`tune fleet`): an Indexed Job whose every pod is one worker running
the same `tune` study on one PostgreSQL database, as workers on several hosts do by hand
(docs/workers.md). The manifests (`manifests`), what is chosen and checked before they are written
(`plan`: the storage without its password, the trace in a ConfigMap or on a claim), the pod's
`tune` command (`command`), the worker image's Dockerfile (`image`) and the whole put together
(`build`). Reads the engine's kind (its image and release); nothing here runs a study."""
