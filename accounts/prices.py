"""What a request costs: the price that applies to it, and the sum, in exact decimals.

The one place that says so: the ledger stores what `cost_of` computes as a record settles,
and the API and the chat show it as `cost_text` writes it.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import QuerySet, Sum

from accounts.models import COST_PLACES, Price, UsageRecord

MILLION = Decimal(1_000_000)
COST_QUANTUM = Decimal(1).scaleb(-COST_PLACES)  # 0.0000000001


def price_at(model: str, moment: dt.datetime) -> Price | None:
    """The model's price valid at `moment`: the latest to start at or before it; None if none."""
    return Price.objects.filter(model=model, valid_from__lte=moment).order_by("-valid_from").first()


def cost_of(price: Price, *, prompt_tokens: int, completion_tokens: int, cached: bool = False) -> Decimal:
    """What a request with these tokens costs at `price`, to COST_PLACES decimal places.

    `cached`: the answer came from the response cache. Its prompt costs the cached input
    price, and its output (the cached answer's tokens) costs nothing unless the price
    charges cache hits.
    """
    if cached:
        output = price.output_per_million if price.charge_cache_hits else Decimal(0)
        total = prompt_tokens * price.cached_input + completion_tokens * output
    else:
        total = prompt_tokens * price.input_per_million + completion_tokens * price.output_per_million
    return (total / MILLION).quantize(COST_QUANTUM, rounding=ROUND_HALF_EVEN)


def recorded_cost(stream_id: str) -> tuple[Decimal, str] | None:
    """A settled record's cost and its currency; None while it streams or where it had no price."""
    row = UsageRecord.objects.filter(stream_id=stream_id).values_list("cost", "cost_currency").first()
    if row is None or row[0] is None:
        return None
    return row[0], row[1]


def spend_of(records: QuerySet[UsageRecord]) -> dict[str, Decimal]:
    """The sum of the records' costs, by currency (records without a cost count for nothing)."""
    totals = (
        records.filter(cost__isnull=False)
        .order_by()
        .values("cost_currency")
        .annotate(spent=Sum("cost"))
        .values_list("cost_currency", "spent")
    )
    return {currency: spent.quantize(COST_QUANTUM) for currency, spent in totals}


def cost_text(cost: Decimal) -> str:
    """A cost as a plain decimal string, with all its places and never an exponent: "0.0000123000"."""
    return f"{cost.quantize(COST_QUANTUM, rounding=ROUND_HALF_EVEN):f}"


def cost_shown(cost: Decimal) -> str:
    """A cost for people: without the trailing zeros of its places ("0.0000123"), never an exponent."""
    text = cost_text(cost).rstrip("0")
    return text + "0" if text.endswith(".") else text
