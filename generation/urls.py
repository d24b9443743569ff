from django.urls import path

from generation import feedback_views, share_views, tool_views, views

app_name = "generation"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("conversations/", views.conversation_list, name="conversation_list"),
    path("search/", views.conversation_search, name="search"),
    path("archived/", views.archived, name="archived"),
    path("<uuid:conversation_id>/", views.conversation, name="conversation"),
    path("<uuid:conversation_id>/rename/", views.conversation_rename, name="conversation_rename"),
    path("<uuid:conversation_id>/delete/", views.conversation_delete, name="conversation_delete"),
    path("<uuid:conversation_id>/pin/", views.conversation_pin, name="conversation_pin"),
    path("<uuid:conversation_id>/archive/", views.conversation_archive, name="conversation_archive"),
    path("<uuid:conversation_id>/settings/", views.conversation_settings, name="conversation_settings"),
    path("<uuid:conversation_id>/tools/", tool_views.conversation_tools, name="conversation_tools"),
    path("<uuid:conversation_id>/export.md", views.conversation_export_markdown, name="conversation_export_markdown"),
    path("<uuid:conversation_id>/export.json", views.conversation_export_json, name="conversation_export_json"),
    path("<uuid:conversation_id>/share/", share_views.conversation_share, name="conversation_share"),
    path("data/", views.your_data, name="your_data"),
    path("data/links/<int:link_id>/revoke/", share_views.shared_link_revoke, name="shared_link_revoke"),
    path("data/export.json", views.your_data_export, name="your_data_export"),
    path("streams/<str:stream_id>/", views.answer_stream, name="answer_stream"),
    path("messages/<int:message_id>/stop/", views.message_stop, name="message_stop"),
    path("messages/<int:message_id>/regenerate/", views.message_regenerate, name="message_regenerate"),
    path("messages/<int:message_id>/edit/", views.message_edit, name="message_edit"),
    path("messages/<int:message_id>/choose/", views.message_choose, name="message_choose"),
    path("messages/<int:message_id>/feedback/", feedback_views.message_feedback, name="message_feedback"),
    path("messages/<int:message_id>/tool-call/", tool_views.tool_call_decision, name="tool_call_decision"),
]
