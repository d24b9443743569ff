from django.urls import path

from generation import views

app_name = "generation"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("<uuid:conversation_id>/", views.conversation, name="conversation"),
    path("messages/<int:message_id>/stop/", views.message_stop, name="message_stop"),
]
