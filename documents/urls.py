from django.urls import path

from documents import views

app_name = "documents"

urlpatterns = [
    path("conversations/<uuid:conversation_id>/upload/", views.document_upload, name="upload"),
    path("conversations/<uuid:conversation_id>/", views.documents_panel, name="panel"),
    path("<int:document_id>/delete/", views.document_delete, name="delete"),
    path("passages/<int:passage_id>/", views.passage, name="passage"),
]
