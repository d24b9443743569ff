from django.contrib import admin

from generation.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "status", "content", "completion_tokens", "ttft_ms", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "model", "updated_at"]
    list_filter = ["model"]
    search_fields = ["title", "user__username"]
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "role", "status", "completion_tokens", "ttft_ms", "created_at"]
    list_filter = ["status", "role", "model"]
    date_hierarchy = "created_at"
    raw_id_fields = ["conversation"]
