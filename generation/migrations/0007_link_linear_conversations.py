"""Existing conversations get their parents (0006_message_branches), in a migration of its
own: on PostgreSQL the rows it updates leave trigger events pending until the transaction
ends, and the previous migration's deferred index and constraint cannot be made while any are.
"""

from django.db import migrations


def link_linear_conversations(apps, schema_editor):
    """Give existing messages their parents, as the page showed them: each prompt follows the
    newest answer before it, and the answers to one prompt (earlier Regenerates) are versions."""
    Message = apps.get_model("generation", "Message")
    conversation_ids = Message.objects.values_list("conversation_id", flat=True).distinct()
    for conversation_id in conversation_ids:
        last_prompt = last_shown = None
        for message in Message.objects.filter(conversation_id=conversation_id).order_by("created_at", "id"):
            if message.role == "assistant" and last_prompt is not None:
                message.parent = last_prompt
            else:
                message.parent = last_shown
                if message.role == "user":
                    last_prompt = message
            message.save(update_fields=["parent"])
            last_shown = message


class Migration(migrations.Migration):
    dependencies = [
        ("generation", "0006_message_branches"),
    ]

    operations = [
        migrations.RunPython(link_linear_conversations, migrations.RunPython.noop),
    ]
