"""A trained model served: KServe's model server (predictor), the ClusterServingRuntime and
InferenceService manifests (render), their creation on a cluster (deploy)."""
