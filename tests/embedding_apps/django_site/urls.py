from django.urls import path

from django_site import views

urlpatterns = [path("reports", views.enqueue_report)]
