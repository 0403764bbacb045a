"""The web dashboard (`serve --dashboard-listen`): pages served from the
service's own event loop that act through the public gRPC API with the
signed-in user's own credential, so they can never show or do more than that
credential could over gRPC."""
