from __future__ import annotations

from typing import Any

from django import forms

from tools.services import OfferedTool


class ConversationToolsForm(forms.Form):
    """Which of the offered tools a conversation lets its model call."""

    tools = forms.MultipleChoiceField(
        label="Tools the model may call", required=False, widget=forms.CheckboxSelectMultiple
    )
    ask = forms.MultipleChoiceField(
        label="Ask every time before calling",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Each call of these waits for your Approve or Deny; the others are always allowed.",
    )

    def __init__(self, *args: Any, offered: list[OfferedTool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("tools", "ask"):
            field = self.fields[name]
            assert isinstance(field, forms.MultipleChoiceField)
            field.choices = self._choices(offered) if name == "tools" else [(t.key, t.spec.name) for t in offered]

    @staticmethod
    def _choices(offered: list[OfferedTool]) -> list[tuple[str, str]]:
        return [
            (
                tool.key,
                f"{tool.spec.name} ({tool.server.name})"
                + (f": {tool.spec.description}" if tool.spec.description else ""),
            )
            for tool in offered
        ]


class ToolCallDecisionForm(forms.Form):
    """The owner's Approve or Deny of a call that waits for it."""

    call_id = forms.CharField(max_length=200)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
