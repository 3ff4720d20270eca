"""RunPod: offers from its GraphQL API (:mod:`.offers`), pods through its REST API (:mod:`.rentals`)."""
