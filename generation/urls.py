from django.urls import path

from generation import views

app_name = "generation"

urlpatterns = [
    path("", views.chat, name="chat"),
    path("<uuid:conversation_id>/", views.conversation, name="conversation"),
]
