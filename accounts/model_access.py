"""The models a user may use, as the accounts app's pages offer them (a key's settings).

Which models the site serves, and which of them a user may use, is the chat app's to say
(generation.services.models_for), a layer above this one: it hands its answer over here as
Django starts (generation.apps). A process without the chat app offers no model.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import User

ModelsOf = Callable[[User], list[str]]

_models_of: ModelsOf | None = None


def models_offered_by(models_of: ModelsOf) -> None:
    """Say how to list the models a user may use, of every kind (chat and embedding)."""
    global _models_of
    _models_of = models_of


def usable_models(user: User) -> list[str]:
    """The models `user` may use, the site's default first; none if no app said how to list them."""
    return list(_models_of(user)) if _models_of is not None else []
