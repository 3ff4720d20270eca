"""Vast.AI: offers from its search API (:mod:`.offers`), rentals through its REST API (:mod:`.rentals`)."""
