"""The content policy at work: prompts checked before admission, answer rules handed to
the producer, matches recorded and counted, the review queue's decisions.

A prompt is checked whole, before its request counts against any limit: a block refuses
it (an InvalidRequest with the code `content_policy_violation`, which every channel shows
in its own way), a mask changes what the model reads, and what is stored of it
(`prompt_masked`). An answer's rules go with its task (`answer_rules_for`) and run inside
the producer (guardrails.matching.AnswerGuard, with guardrails.moderation for moderation
services), so the stream store, and through it every reader, the saved answer and the
response cache, only ever hold the masked, judged text. The rules are read once per
process and version (guardrails.rule_cache), not at every admission.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from prometheus_client import Counter

from accounts.models import Plan, UsageRecord
from accounts.services import InvalidRequest
from guardrails import matching, moderation, rule_cache
from guardrails.cached_answers import cached_answers_evict
from guardrails.models import Action, PolicyEvent, PolicyRule, Stage
from inference.generators import Prompt

logger = logging.getLogger(__name__)

POLICY_CODE = "content_policy_violation"
DEFAULT_REFUSAL = "This request was refused by a content policy."
REDACTED = "[redacted]"
REMOVED = "[removed by a moderator]"
EXCERPT_CHARS = 500

POLICY_MATCHES = Counter(
    "chatsite_policy_matches", "Content policy matches, by rule, action and stage.", ["rule", "action", "stage"]
)


class PromptRefused(InvalidRequest):
    """A prompt a rule blocks: a 400 with its own code on the API, its words in the chat."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages", code=POLICY_CODE)


@dataclass(frozen=True)
class Scope:
    """Who asks, how and of which model: what decides which rules apply."""

    plan_id: int | None
    channel: str
    model: str
    stream_id: str = ""  # the generation it would start


@dataclass(frozen=True)
class _EnabledRule:
    """A rule as each process remembers it: read-only, its plans' ids read with it."""

    rule: PolicyRule
    plan_ids: frozenset[int]


def rules_for(*, stage: str, scope: Scope) -> list[PolicyRule]:
    """The enabled rules for `stage` (prompt or answer) in `scope`, in order."""
    return [
        enabled.rule
        for enabled in _enabled_rules()
        if enabled.rule.stage in (stage, Stage.BOTH) and _in_scope(enabled, scope)
    ]


def _enabled_rules() -> list[_EnabledRule]:
    version = rule_cache.rules_version()
    enabled = rule_cache.remembered_rules(version)
    if enabled is None:
        rules = PolicyRule.objects.filter(enabled=True).prefetch_related("plans")
        enabled = [_EnabledRule(rule, frozenset(plan.pk for plan in rule.plans.all())) for rule in rules]
        rule_cache.remember_rules(version, enabled)
    return enabled


def _in_scope(enabled: _EnabledRule, scope: Scope) -> bool:
    rule = enabled.rule
    return (
        (not enabled.plan_ids or scope.plan_id in enabled.plan_ids)
        and (not rule.channels or scope.channel in rule.channels)
        and (not rule.model_names or scope.model in rule.model_names)
    )


def answer_rules_for(*, scope: Scope) -> tuple[dict[str, Any], ...]:
    """The answer rules a task carries to its producer, as JSON (a moderation service's
    token included: the task travels through the site's own broker, as its prompt does)."""
    return tuple(rule.spec().to_json() for rule in rules_for(stage=Stage.ANSWER, scope=scope))


def answer_guard(rules: Iterable[dict[str, Any]]) -> matching.AnswerGuard | None:
    """The producer's guard of an answer: the text rules, then the moderation services."""
    specs = [matching.RuleSpec.from_json(rule) for rule in rules]
    if not specs:
        return None
    judges = [spec for spec in specs if spec.matcher == matching.MODERATION]
    return matching.AnswerGuard(
        matching.TextPolicy(specs), moderation=moderation.AnswerModeration(judges) if judges else None
    )


# -- prompts -------------------------------------------------------------------------------


def prompt_check(
    *, user: Any, plan: Plan | None, channel: str, model: str, prompt: Prompt, stream_id: str = ""
) -> Prompt:
    """The prompt as the model may read it: masked where a mask rule matched. Raises
    PromptRefused where a block rule matched, or a moderation service flagged it (or failed,
    for a rule that fails closed). Blocks and flags in the newest message are recorded."""
    scope = Scope(plan.pk if plan else None, channel, model, stream_id)
    rules = rules_for(stage=Stage.PROMPT, scope=scope)
    if not rules:
        return prompt
    policy = matching.TextPolicy(rule.spec() for rule in rules)
    texts = _checked_texts(prompt)
    applied = {index: policy.apply(text) for index, text in texts.items()}
    newest = max(texts, default=None)
    for index, result in applied.items():
        for hit in result.hits:
            _count(hit.rule.name, hit.rule.action, Stage.PROMPT)
            if hit.rule.action == Action.BLOCK or (hit.rule.action == Action.FLAG and index == newest):
                _record(hit.rule.id, hit.rule.name, hit.rule.action, Stage.PROMPT, user, scope, hit.text)
        if result.blocked_by is not None:
            raise PromptRefused(result.blocked_by.rule.message or DEFAULT_REFUSAL)
    if newest is not None:
        for rule in rules:
            if rule.matcher == PolicyRule.Matcher.MODERATION and moderation_flags(rule, texts[newest]):
                _count(rule.name, rule.action, Stage.PROMPT)
                _record(rule.pk, rule.name, rule.action, Stage.PROMPT, user, scope, texts[newest])
                if rule.action == Action.BLOCK:
                    raise PromptRefused(rule.message or DEFAULT_REFUSAL)
    return _with_texts(prompt, {index: result.text for index, result in applied.items()})


def _checked_texts(prompt: Prompt) -> dict[int, str]:
    """The texts of a prompt that its sender wrote, by position: all but the answers."""
    if isinstance(prompt, str):
        return {0: prompt}
    return {
        index: message["content"]
        for index, message in enumerate(prompt)
        if message.get("role") != "assistant" and isinstance(message.get("content"), str)
    }


def _with_texts(prompt: Prompt, texts: dict[int, str]) -> Prompt:
    if isinstance(prompt, str):
        return texts.get(0, prompt)
    return [{**message, "content": texts[index]} if index in texts else message for index, message in enumerate(prompt)]


def moderation_flags(rule: PolicyRule, text: str) -> bool:
    """Whether the rule's moderation service (OpenAI's /v1/moderations shape) flags `text`.
    A service that is slow past the rule's timeout, down or answers nonsense flags it only
    where the rule fails closed."""
    return moderation.moderation_verdict(rule.spec(), text)


def prompt_masked(*, plan: Plan | None, channel: str, model: str, prompt: Prompt) -> Prompt:
    """A prompt that prompt_check let through, as it made it for the model: what to store
    of it, so that the model and every reader see the same text. Records nothing (the
    check did); a typed message alone is masked as it was within the whole prompt."""
    rules = rules_for(stage=Stage.PROMPT, scope=Scope(plan.pk if plan else None, channel, model))
    policy = matching.TextPolicy(rule.spec() for rule in rules)
    if not policy:
        return prompt
    return _with_texts(prompt, {index: policy.apply(text).text for index, text in _checked_texts(prompt).items()})


# -- answers -------------------------------------------------------------------------------


def answer_hits_record(*, stream_id: str, model: str, message_id: int | None, hits: Sequence[matching.Hit]) -> None:
    """Count an answer's matches, and record its blocks and flags (the producer's thread
    calls this once the answer ended)."""
    if not hits:
        return
    usage = UsageRecord.objects.filter(stream_id=stream_id).values("user_id", "channel").first()
    user_id, channel = (usage["user_id"], usage["channel"]) if usage else (None, "")
    for hit in hits:
        _count(hit.rule.name, hit.rule.action, Stage.ANSWER)
        if hit.rule.action != Action.MASK:
            PolicyEvent.objects.create(
                rule_id=_existing_rule(hit.rule.id),
                rule_name=hit.rule.name,
                action=hit.rule.action,
                stage=Stage.ANSWER,
                user_id=user_id,
                channel=channel,
                model=model,
                excerpt=hit.text[:EXCERPT_CHARS],
                stream_id=stream_id,
                message_id=message_id,
            )


def _existing_rule(rule_id: int) -> int | None:
    return rule_id if rule_id and PolicyRule.objects.filter(pk=rule_id).exists() else None


def _count(rule: str, action: str, stage: str) -> None:
    POLICY_MATCHES.labels(rule=rule, action=action, stage=stage).inc()


def _record(rule_id: int, name: str, action: str, stage: str, user: Any, scope: Scope, excerpt: str) -> None:
    PolicyEvent.objects.create(
        rule_id=_existing_rule(rule_id),
        rule_name=name,
        action=action,
        stage=stage,
        user=user if getattr(user, "pk", None) else None,
        channel=scope.channel,
        model=scope.model,
        excerpt=excerpt[:EXCERPT_CHARS],
        stream_id=scope.stream_id,
    )


# -- the review queue ----------------------------------------------------------------------


def policy_event_keep(*, event: PolicyEvent) -> None:
    event.review = PolicyEvent.Review.KEPT
    event.save(update_fields=["review"])


def policy_event_redact(*, event: PolicyEvent) -> None:
    """Replace the flagged text with REDACTED wherever it is stored: the chat message, its
    share links and the event; the response cache's copy is evicted."""
    message = _flagged_message(event)
    _cached_copies_evict(event, message)
    if message is not None and event.excerpt:
        _message_rewrite(message, lambda text: text.replace(event.excerpt, REDACTED))
    event.excerpt, event.review = REDACTED, PolicyEvent.Review.REDACTED
    event.save(update_fields=["excerpt", "review"])


def policy_event_delete(*, event: PolicyEvent) -> None:
    """Remove the flagged message's whole text (the message stays, so its thread holds);
    the response cache's copy is evicted."""
    message = _flagged_message(event)
    _cached_copies_evict(event, message)
    if message is not None:
        before = message.content
        _message_rewrite(message, lambda text: REMOVED if text == before else text)
    event.excerpt, event.review = "", PolicyEvent.Review.DELETED
    event.save(update_fields=["excerpt", "review"])


def _cached_copies_evict(event: PolicyEvent, message: Any) -> None:
    # The event's stream is the answer it was found in, or the answer to its prompt; the
    # message's, where it is an answer, the same or one replayed from the cache.
    cached_answers_evict(stream_ids=[event.stream_id, getattr(message, "stream_id", None) or ""])


def _message_rewrite(message: Any, rewrite: Callable[[str], str]) -> None:
    """Rewrite a chat message's text, and the copies of it in its conversation's share link."""
    message.content = rewrite(message.content)
    message.save(update_fields=["content"])
    for link in apps.get_model("generation", "SharedLink").objects.filter(conversation_id=message.conversation_id):
        link.messages = [{**shown, "content": rewrite(shown.get("content", ""))} for shown in link.messages]
        link.save(update_fields=["messages"])


def _flagged_message(event: PolicyEvent) -> Any:
    # By name, not imported: the chat app calls this one (generation → guardrails), so
    # importing its models here would point the layers both ways.
    message_model = apps.get_model("generation", "Message")
    if event.message_id is not None:
        return message_model.objects.filter(pk=event.message_id).first()
    if event.stream_id and event.stage == Stage.PROMPT:  # the prompt its answer answers
        answer = message_model.objects.filter(stream_id=event.stream_id).select_related("parent").first()
        return answer.parent if answer is not None else None
    return None


def scope_for(*, plan: Plan | None, channel: str, model: str) -> Scope:
    return Scope(plan.pk if plan else None, channel, model)
